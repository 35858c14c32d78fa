"""Time fused_linear as the batch-1 frame chains it: a slow layer's four projections (28 layers, each its
own weights) and a fast layer's (4 layers, 10 positions), in one CUDA graph, per launch setting and
with the launch trigger of the next kernel early (before the weight loads) or where main has it.

    python chain_bench.py            # from the repository root; prints us per slow layer / per fast position
"""
import itertools, sys, json
import torch, triton, triton.language as tl
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
from engine.model import fused_linear as FL
from engine.model.launch_control import let_dependents_launch, wait_for_inputs
from graph_timing import microseconds_per_call


@triton.jit
def _wait_only():
    return tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _variant(x_ptr, w_ptr, norm_ptr, residual_ptr, out_ptr, eps, K: tl.constexpr, N: tl.constexpr,
             has_norm: tl.constexpr, gated: tl.constexpr, has_residual: tl.constexpr, block_n: tl.constexpr,
             block_k: tl.constexpr, early: tl.constexpr, weight_eviction: tl.constexpr):
    """main's _fused_linear (bf16, no scales), but with `early` the next kernel may launch before this
    one loads anything, and the sums are taken per block (no [block_n, block_k] fp32 tile kept)."""
    if early:
        x_ptr += let_dependents_launch()
    n = tl.program_id(0) * block_n + tl.arange(0, block_n)
    k = tl.arange(0, block_k)
    live_n = n < N
    dtype = x_ptr.dtype.element_ty
    w_rows = w_ptr + n[:, None] * K
    live = live_n[:, None] & (k < K)[None, :]
    w_block = tl.load(w_rows + k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
    if gated:
        up_block = tl.load(w_rows + N * K + k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
    if early:
        after = _wait_only()
    else:
        after = wait_for_inputs()
    x_ptr += after
    residual_ptr += after
    if has_norm:
        squares = tl.zeros([block_k], tl.float32)
        for k0 in range(0, K, block_k):
            xk = tl.load(x_ptr + k0 + k, mask=k0 + k < K, other=0.0).to(tl.float32)
            squares += xk * xk
        inv_rms = tl.rsqrt(tl.sum(squares, 0) / K + eps)
    sums = tl.zeros([block_n], tl.float32)
    up_sums = tl.zeros([block_n], tl.float32)
    for k0 in range(0, K, block_k):
        live_k = k0 + k < K
        xk = tl.load(x_ptr + k0 + k, mask=live_k, other=0.0)
        if has_norm:
            scale = tl.load(norm_ptr + k0 + k, mask=live_k, other=0.0).to(tl.float32)
            xk = ((xk.to(tl.float32) * inv_rms).to(dtype).to(tl.float32) * scale).to(dtype)
        xf = xk.to(tl.float32)[None, :]
        sums += tl.sum(w_block.to(tl.float32) * xf, 1)
        if gated:
            up_sums += tl.sum(up_block.to(tl.float32) * xf, 1)
        next_k = k0 + block_k + k
        live = live_n[:, None] & (next_k < K)[None, :]
        w_block = tl.load(w_rows + next_k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
        if gated:
            up_block = tl.load(w_rows + N * K + next_k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
    out = sums.to(dtype)
    if gated:
        gate = out.to(tl.float32)
        up = up_sums.to(dtype).to(tl.float32)
        out = ((gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up).to(dtype)
    if has_residual:
        out = (tl.load(residual_ptr + n, mask=live_n, other=0.0).to(tl.float32) + out.to(tl.float32)).to(dtype)
    tl.store(out_ptr + n, out, mask=live_n)


def make_linear(setting):
    """setting: None (main's kernel and launch) or (block_n, block_k, warps, early, maxnreg)."""
    def linear(x, w, norm, residual, gated, hint=""):
        if setting is None:
            return FL.launch(FL._fused_linear, x, w, None, norm, residual, 1e-6, gated, weight_eviction=hint)
        block_n, block_k, warps, early, maxnreg = setting
        K = x.shape[1]; N = w.shape[0] // 2 if gated else w.shape[0]
        out = torch.empty((1, N), device=x.device, dtype=x.dtype)
        extra = {"maxnreg": maxnreg} if maxnreg else {}
        _variant[(triton.cdiv(N, block_n),)](
            x, w, x if norm is None else norm, x if residual is None else residual, out, 1e-6, K=K, N=N,
            has_norm=norm is not None, gated=gated, has_residual=residual is not None, block_n=block_n,
            block_k=min(block_k, K), early=early, weight_eviction=hint, launch_pdl=True,
            num_warps=warps, num_stages=1, **extra)
        return out
    return linear


def layers(count, qkv_width, attn_width, gen):
    def w(n, k):
        return (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).bfloat16()
    return [dict(qkv=w(qkv_width, 1024), wo=w(1024, attn_width), w13=w(6144, 1024), w2=w(1024, 3072),
                 n1=(1 + 0.1 * torch.randn(1024, device="cuda", generator=gen)).bfloat16(),
                 n2=(1 + 0.1 * torch.randn(1024, device="cuda", generator=gen)).bfloat16()) for _ in range(count)]


def chain(linear, weights, state, attn_width, hints):
    def call(i):
        L = weights[i % len(weights)]
        h = state["h"]
        q = linear(h, L["qkv"], L["n1"], None, False, hints[0])
        h = linear(q[:, :attn_width], L["wo"], None, h, False, hints[1])
        g = linear(h, L["w13"], L["n2"], None, True, hints[2])
        state["h"] = linear(g, L["w2"], None, h, False, hints[3])
    return call


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    slow, fast = layers(28, 4096, 2048, gen), layers(4, 2048, 1024, gen)
    x0 = torch.randn(1, 1024, device="cuda", generator=gen).bfloat16()
    settings = [None] + [(bn, bk, w, e, None) for (bn, bk, w), e in itertools.product(
        [(4, 1024, 8), (4, 1024, 4), (2, 1024, 4), (2, 1024, 2), (8, 1024, 4), (8, 1024, 8), (16, 1024, 8),
         (4, 512, 4), (8, 512, 8)], (False, True))]
    settings += [(4, 1024, 4, True, 64), (8, 1024, 8, True, 64), (8, 1024, 4, True, 128)]
    results = []
    for s in settings:
        linear = make_linear(s)
        try:
            ref_state = {"h": x0.clone()}; chain(make_linear(None), slow, ref_state, 2048, ("",) * 4)(0)
            state = {"h": x0.clone()}; chain(linear, slow, state, 2048, ("",) * 4)(0)
            diff = (state["h"].float() - ref_state["h"].float()).abs().max().item()
            state = {"h": x0.clone()}
            slow_us = microseconds_per_call(chain(linear, slow, state, 2048, ("evict_first",) * 4), 28, 50)
            fast_us = microseconds_per_call(chain(linear, fast, state, 1024,
                                                  ("evict_first", "evict_last", "evict_first", "evict_last")), 40, 50)
        except Exception as e:  # noqa: BLE001 (a setting that does not compile or fit)
            print(s, "failed", type(e).__name__, str(e)[:100], flush=True); continue
        results.append({"setting": s, "slow_layer_us": round(slow_us, 2), "fast_layer_us": round(fast_us, 2), "diff": diff})
        print(f"{str(s):32s} slow layer {slow_us:6.2f} us  fast layer {fast_us:6.2f} us  diff {diff:.1e}", flush=True)
    if len(sys.argv) > 1:
        json.dump({"device": torch.cuda.get_device_name(), "results": results}, open(sys.argv[1], "w"), indent=1)


main()
