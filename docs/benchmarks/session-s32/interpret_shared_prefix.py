"""decode_attention with shared-prefix-reads.diff applied, in Triton's interpreter on the CPU (fp32):

    git apply docs/benchmarks/session-s32/shared-prefix-reads.diff   # or session-s36/shared-prefix-reads-s36.diff,
                                                                     # the same change rebased on main in session s36
    TRITON_INTERPRET=1 python docs/benchmarks/session-s32/interpret_shared_prefix.py   # needs the triton package; no GPU

Rows 1, 3 and 4 read their first 200, 200 and 130 positions from rows 0, 0 and 2, their own copies there
poisoned with NaN: the output must equal the kernel's on caches holding the sources' values, and be NaN
without the redirect. (interpreted_attention.py: the interpreter's range().)
"""
import sys

import torch

sys.path.insert(0, "docs/benchmarks/session-s32")
from interpreted_attention import decode_attention as A  # noqa: E402
from engine.model.dual_ar import Attention, KVView, rope_table  # noqa: E402

torch.manual_seed(0)
B, H, KV, D, cap, n_keys = 6, 4, 2, 16, 512, 300
attn = Attention(H * D, H, KV, D, 1e-6, True, False, False); attn.requires_grad_(False)
qkv = torch.randn(B, (H + 2 * KV) * D)
k_cache, v_cache = torch.randn(B, KV, cap, D), torch.randn(B, KV, cap, D)
positions = torch.tensor([250, 260, 140, n_keys - 1, 135, 90])
rope = rope_table(cap, D, 1e6)[positions][:, None]
shared = {1: (0, 200), 3: (0, 200), 4: (2, 130)}
prefix = torch.stack([torch.arange(B), torch.zeros(B, dtype=torch.long)], 1)
same_k, same_v, pk, pv = k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()
for r, (src, n) in shared.items():
    prefix[r] = torch.tensor([src, n])
    same_k[r, :, :n], same_v[r, :, :n] = k_cache[src, :, :n], v_cache[src, :, :n]
    pk[r, :, :n] = pv[r, :, :n] = float("nan")
def run(k, v, pre):
    k, v = k.clone(), v.clone()
    out = A.launch(A._attend_split, A._merge_splits, qkv, *attn.kernel_norms(), rope.reshape(B, -1), k, v, positions, n_keys, H, False, prefix=pre)
    return out, k, v
exp = run(same_k, same_v, None)
got = run(pk, pv, prefix)
print("equal out", torch.equal(got[0], exp[0]), (got[0] - exp[0]).abs().max().item())
bad = run(pk, pv, None)[0]
print("without redirect has nan:", torch.isnan(bad).any().item())
keys = torch.arange(n_keys)
kv = KVView(same_k.clone(), same_v.clone(), positions[:, None], keys, keys <= positions[:, None, None, None])
plain = attn.attend(qkv[:, None], rope, kv)[:, 0]
print("vs plain", (got[0] - plain).abs().max().item())
