"""The batch-1 decode step's projections as one Triton kernel each, with their neighbours folded in.

A batch-1 frame is ~1,000 dependent kernels. Compiled by Inductor, each projection of a
transformer block is a reduction kernel reading its weights well below the memory's bandwidth, with
the RMSNorm before it, the SiLU gate and the residual add after it partly in kernels of their own.
Here one kernel does, for the step's one row:

    out = [residual +] [silu(gate) *] (RMSNorm(x) | x) @ W^T

RMSNorm: each program recomputes the row's norm over K (a few KB, from L2), then scales the inputs
as it streams them, rounding where `dual_ar.RMSNorm` rounds. Gated: W holds the gate rows above the
up rows (FeedForward.w13); a program multiplies both halves for its columns and writes
silu(gate) * up, rounded like the eager `F.silu(w1(x)) * w3(x)`. Products are summed in fp32, so the
results equal the plain path up to the order of the sums. int8 weights with one scale per output
row (torchao's Int8Tensor in --quantize int8) are read as they are, half the bytes of bf16, and each
column's fp32 sum is multiplied by its row's fp32 scale and rounded once; torchao's own bf16 path
rounds more often, so in bf16 the two can differ by about one unit in the last place.

Few columns per program and whole rows of W per iteration keep many loads in flight: timed from
memory, the slow block's four projections take about 40% less time than compiled from the plain
ops. Batched rows keep cuBLAS, which is faster there.

Programmatic dependent launch (Hopper and newer, see compilation.pdl_available): the kernel launches while the
kernel before it still runs, loads its first block of weights, and only then waits for that
kernel's writes; timed alone, 10-30% off each projection. Inductor launches the Triton kernels of a
triton_op without PDL (torch 2.11: its metadata for user kernels has no launch_pdl), so this is a
custom op, opaque to Inductor, that launches the kernel itself; CUDA graphs capture it the same way.

The weight loads can carry an L2 cache hint (weight_eviction: "evict_first" for weights read once a
frame, "evict_last" for ones read again soon); hints change no result (see
DualARTransformer.weight_cache_hints). Importing this module needs Triton and torch >= 2.6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..compilation import pdl_available
from .launch_control import launch_options, wait_for_inputs


@dataclass(frozen=True)
class Launch:
    """Columns per program, K per iteration, warps, pipeline stages (TUNED: per shape)."""

    block_n: int = 4
    block_k: int = 1024
    num_warps: int = 8
    num_stages: int = 1
    pdl: bool = True  # programmatic dependent launch where pdl_available()


# S1-mini's projections by shape (K, N, gated): the fastest setting of each in a sweep over launch
# settings (28 calls in a CUDA graph, each with its own weights); together they make a batch-1 frame
# ~1% faster than Launch() everywhere. Other shapes (the demo model's, the output heads') keep
# Launch().
TUNED: dict[tuple[int, int, bool], Launch] = {
    (1024, 4096, False): Launch(block_n=8, num_warps=2),  # slow qkv
    # Whole K in one block (2048, and 3072 as 4096 masked): every weight a program reads is requested
    # before its PDL wait, while the kernel before still runs (the sweep stopped at 1024).
    (2048, 1024, False): Launch(block_n=2, block_k=2048, num_warps=4),  # slow output
    (1024, 2048, False): Launch(block_n=8, num_warps=8),  # fast qkv
    (1024, 1024, False): Launch(block_n=2, num_warps=2),  # fast output (and the fast head, 1,024 codes)
    (1024, 3072, True): Launch(block_n=4, block_k=512, num_warps=8),  # gate/up
    (3072, 1024, False): Launch(block_n=4, block_k=4096, num_warps=8),  # down
}


def settings_for(depth: int, columns: int, gated: bool) -> Launch:
    return TUNED.get((depth, columns, gated), Launch())


@triton.jit
def _fused_linear(x_ptr, w_ptr, w_scale_ptr, norm_ptr, residual_ptr, out_ptr, eps,
                  K: tl.constexpr, N: tl.constexpr, has_w_scale: tl.constexpr, has_norm: tl.constexpr,
                  gated: tl.constexpr, has_residual: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr,
                  pdl: tl.constexpr, weight_eviction: tl.constexpr):
    n = tl.program_id(0) * block_n + tl.arange(0, block_n)
    k = tl.arange(0, block_k)
    live_n = n < N
    dtype = x_ptr.dtype.element_ty
    # The first block of weights: loaded before anything the kernel before writes (wait_for_inputs).
    w_rows = w_ptr + n[:, None] * K
    live = live_n[:, None] & (k < K)[None, :]
    w_block = tl.load(w_rows + k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
    if gated:
        up_block = tl.load(w_rows + N * K + k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
    one_block: tl.constexpr = K <= block_k
    if has_norm and one_block:  # the norm's weights are no one's output: requested before the wait too
        scale = tl.load(norm_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    if pdl:
        after = wait_for_inputs()
        x_ptr += after
        residual_ptr += after
    # Every load after the wait is requested as early as it can be, since each one that waits for
    # another adds a trip to memory to the frame's critical path: the residual now, used last.
    if has_residual:
        residual = tl.load(residual_ptr + n, mask=live_n, other=0.0)
    if one_block:
        x_all = tl.load(x_ptr + k, mask=k < K, other=0.0)
    if has_norm:
        squares = tl.zeros([block_k], tl.float32)
        for k0 in range(0, K, block_k):
            if one_block:
                xk = x_all.to(tl.float32)
            else:
                xk = tl.load(x_ptr + k0 + k, mask=k0 + k < K, other=0.0).to(tl.float32)
            squares += xk * xk
        inv_rms = tl.rsqrt(tl.sum(squares, 0) / K + eps)
    products = tl.zeros([block_n, block_k], tl.float32)
    up_products = tl.zeros([block_n, block_k], tl.float32)
    for k0 in range(0, K, block_k):
        live_k = k0 + k < K
        if one_block:
            xk = x_all
        else:
            xk = tl.load(x_ptr + k0 + k, mask=live_k, other=0.0)
        if has_norm:  # RMSNorm: normalised in fp32, rounded, then scaled by the weight and rounded
            if not one_block:
                scale = tl.load(norm_ptr + k0 + k, mask=live_k, other=0.0).to(tl.float32)
            xk = ((xk.to(tl.float32) * inv_rms).to(dtype).to(tl.float32) * scale).to(dtype)
        xf = xk.to(tl.float32)[None, :]
        products += w_block.to(tl.float32) * xf
        if gated:
            up_products += up_block.to(tl.float32) * xf
        # The next block (none past K): in flight while this one's products are summed.
        next_k = k0 + block_k + k
        live = live_n[:, None] & (next_k < K)[None, :]
        w_block = tl.load(w_rows + next_k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
        if gated:
            up_block = tl.load(w_rows + N * K + next_k[None, :], mask=live, other=0.0, eviction_policy=weight_eviction)
    sums = tl.sum(products, 1)
    up_sums = tl.sum(up_products, 1)
    if has_w_scale:  # int8 rows: one scale per output row (gate rows, then up rows)
        sums *= tl.load(w_scale_ptr + n, mask=live_n, other=0.0).to(tl.float32)
        if gated:
            up_sums *= tl.load(w_scale_ptr + N + n, mask=live_n, other=0.0).to(tl.float32)
    out = sums.to(dtype)
    if gated:  # silu(gate) * up, each rounded as the eager ops round
        gate = out.to(tl.float32)
        up = up_sums.to(dtype).to(tl.float32)
        out = ((gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up).to(dtype)
    if has_residual:
        out = (residual.to(tl.float32) + out.to(tl.float32)).to(dtype)
    tl.store(out_ptr + n, out, mask=live_n)


def launch(kernel, x: Tensor, weight: Tensor, weight_scale: Tensor | None, norm_weight: Tensor | None,
           residual: Tensor | None, eps: float, gated: bool, settings: Launch | None = None,
           weight_eviction: str = "") -> Tensor:
    """Run `kernel` (_fused_linear) on the operands, with `settings` or the shape's (settings_for);
    see fused_linear."""
    torch._check(x.shape[0] == 1, lambda: "fused_linear takes one row")
    depth = x.shape[1]
    columns = weight.shape[0] // 2 if gated else weight.shape[0]
    settings = settings or settings_for(depth, columns, gated)
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty((1, columns), device=x.device, dtype=x.dtype)
    pdl = settings.pdl and pdl_available(x.device)
    kernel[(triton.cdiv(columns, settings.block_n),)](
        x, weight, x if weight_scale is None else weight_scale.contiguous(),
        x if norm_weight is None else norm_weight, x if residual is None else residual.contiguous(),
        out, eps, K=depth, N=columns, has_w_scale=weight_scale is not None, has_norm=norm_weight is not None,
        gated=gated, has_residual=residual is not None, block_n=settings.block_n,
        block_k=min(settings.block_k, triton.next_power_of_2(depth)), pdl=pdl, **launch_options(pdl),
        weight_eviction=weight_eviction,
        num_warps=settings.num_warps, num_stages=settings.num_stages)
    return out


@torch.library.custom_op("s1mini::fused_linear", mutates_args=())
def fused_linear(x: Tensor, weight: Tensor, weight_scale: Tensor | None, norm_weight: Tensor | None,
                 residual: Tensor | None, eps: float, gated: bool, weight_eviction: str = "") -> Tensor:
    """x (1, K); weight (N, K), or (2N, K) gate rows then up rows when gated, in x's dtype, or int8
    with weight_scale (N,) or (2N,) one scale per row (else None); norm_weight (K,) or None;
    residual (1, N) or None; weight_eviction: the L2 cache hint of the weight loads ("",
    "evict_first" or "evict_last"). Returns (1, N) in x's dtype; see the module docstring."""
    return launch(_fused_linear, x, weight, weight_scale, norm_weight, residual, eps, gated,
                  weight_eviction=weight_eviction)


@fused_linear.register_fake
def _(x: Tensor, weight: Tensor, weight_scale: Tensor | None, norm_weight: Tensor | None,
      residual: Tensor | None, eps: float, gated: bool, weight_eviction: str = "") -> Tensor:
    return x.new_empty((1, weight.shape[0] // 2 if gated else weight.shape[0]))
