"""attend_project's kernel in Triton's interpreter (CPU) against the plain path: Attention.attend (SDPA)
then wo and the residual, in fp32 (tight) and bf16 (as close to fp32 as the plain bf16 path).

    TRITON_INTERPRET=1 PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s34/interpret_attend_project.py
"""
import sys
sys.path.insert(0, ".")
import torch
from engine.model import attend_project  # needs attend-project.diff applied
from engine.model.dual_ar import Attention, KVView, rope_table

FAST = dict(n_heads=16, kv_heads=8, head_dim=64, qk_norm=False)


def case(n_keys, position, dtype, n_heads, kv_heads, head_dim, qk_norm, capacity=10, columns=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    attn = Attention(columns, n_heads, kv_heads, head_dim, 1e-6, qk_norm, False, False).requires_grad_(False)
    if qk_norm:
        attn.q_norm.weight.data = 1 + 0.1 * torch.randn(head_dim, generator=g)
        attn.k_norm.weight.data = 1 + 0.1 * torch.randn(head_dim, generator=g)
    attn.wo.weight.data = torch.randn(columns, n_heads * head_dim, generator=g) / (n_heads * head_dim) ** 0.5
    qkv = torch.randn(1, (n_heads + 2 * kv_heads) * head_dim, generator=g)
    k, v = (torch.randn(1, kv_heads, capacity, head_dim, generator=g) for _ in range(2))
    residual = torch.randn(1, columns, generator=g)
    positions = torch.tensor([position])
    rope = rope_table(capacity, head_dim, 1e6)[positions][:, None]
    attn = attn.to(dtype)
    return attn, qkv.to(dtype), rope, k.to(dtype), v.to(dtype), positions, residual.to(dtype), n_keys


def plain(attn, qkv, rope, k, v, positions, residual, n_keys):
    k, v = k.clone(), v.clone()
    keys = torch.arange(n_keys)
    kv = KVView(k, v, positions[:, None], keys, keys <= positions[:, None, None, None])
    out = attn.attend(qkv[:, None], rope, kv)[:, 0]
    return residual + attn.wo(out), k, v


def kernel(attn, qkv, rope, k, v, positions, residual, n_keys):
    k, v = k.clone(), v.clone()
    out = attend_project.launch(attend_project._attend_and_project, qkv, *attn.kernel_norms(), rope.reshape(1, -1),
                                k, v, positions, n_keys, attn.n_head, attn.wo.weight, None, residual, "")
    return out, k, v


failures = 0
for n_keys, position, nan_past, shape in [(10, 9, False, FAST), (10, 0, False, FAST), (10, 4, True, FAST), (6, 5, False, FAST),
                                         (10, 7, False, dict(FAST, qk_norm=True))]:
    c = case(n_keys, position, torch.float32, **shape)
    expected_all = plain(*c)
    if nan_past:  # stale slots past the position (which the plain path reads, masked) must not reach the output
        for cache in c[3:5]:
            cache[:, :, position + 1:] = float("nan")
    for name, got, expected in zip(("out", "k", "v"), kernel(*c), expected_all):
        err = (got - expected).abs().max().item() if not nan_past or name == "out" else \
            (got[:, :, :position + 1] - expected[:, :, :position + 1]).abs().max().item()
        ok = err <= 1e-5
        failures += not ok
        print(f"fp32 n_keys {n_keys} position {position} nan_past {nan_past} {name}: max err {err:.2e} {'ok' if ok else 'FAIL'}")
c32 = case(10, 8, torch.float32, **FAST)
reference = plain(*c32)[0]
c16 = case(10, 8, torch.bfloat16, **FAST)
ops_err = (plain(*c16)[0].float() - reference).abs().max().item()
got_err = (kernel(*c16)[0].float() - reference).abs().max().item()
ok = got_err <= 2 * ops_err + 1e-6
failures += not ok
print(f"bf16: kernel err {got_err:.3e}, plain bf16 err {ops_err:.3e} {'ok' if ok else 'FAIL'}")
print("FAILURES", failures)
