"""decode_attention in Triton's interpreter on the CPU (fp32), against Attention.attend's plain path: the
output within 1e-4, the caches equal and NaNs past each row's position ignored, for one row (early keys) and batches, split and direct:

    TRITON_INTERPRET=1 PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s33/interpret_attention.py

Injecting no new key (is_new never true) makes it print BAD (worst 2.38).
"""
import sys
import torch
sys.path.insert(0, "docs/benchmarks/session-s32")
from interpreted_attention import decode_attention as A
from engine.model.dual_ar import Attention, rope_table, KVView
torch.manual_seed(0)
H, KV, D = 4, 2, 16
attn = Attention(H * D, H, KV, D, 1e-6, True, False, False).requires_grad_(False)
worst, bad = 0, 0
for batch, n_keys, cap, one_row in [(1, 512, 1024, True), (1, 300, 1024, True), (1, 1024, 1024, True), (3, 700, 1024, False),
                                    (5, 1024, 1024, False), (2, 10, 16, False), (1, 7, 16, True), (4, 600, 1024, False)]:
    qkv = torch.randn(batch, (H + 2 * KV) * D)
    k_cache, v_cache = torch.randn(batch, KV, cap, D), torch.randn(batch, KV, cap, D)
    positions = torch.randint(0, n_keys, (batch,)); positions[-1] = n_keys - 1
    if batch > 2: positions[0] = 0
    if cap <= 64: positions[0] = n_keys // 2  # a direct cache's slots between the position and n_keys
    rope = rope_table(cap, D, 1e6)[positions]
    k, v = k_cache.clone(), v_cache.clone()
    out = A.launch(A._attend_split, A._merge_splits, qkv, *attn.kernel_norms(), rope.reshape(batch, -1), k, v,
                   positions, n_keys, H, one_row)
    k2, v2 = k_cache.clone(), v_cache.clone()
    keys = torch.arange(n_keys)
    kv = KVView(k2[:, :, :n_keys], v2[:, :, :n_keys], positions[:, None], keys, keys <= positions[:, None, None, None])
    ref = attn.attend(qkv[:, None], rope[:, None], kv)[:, 0]
    err = (out - ref).abs().max().item(); worst = max(worst, err)
    past = torch.arange(cap)[None, None, :, None] >= positions[:, None, None, None]  # NaNs there change nothing
    poisoned = [t.masked_fill(past, float("nan")) for t in (k_cache, v_cache)]
    again = A.launch(A._attend_split, A._merge_splits, qkv, *attn.kernel_norms(), rope.reshape(batch, -1), *poisoned,
                     positions, n_keys, H, one_row)
    bad += not torch.equal(again, out)
    caches_same = torch.allclose(k, k2, atol=1e-5) and torch.allclose(v, v2, atol=1e-6)
    bad += not caches_same
    print(batch, n_keys, cap, err, "caches equal" if caches_same else "CACHES DIFFER")
print("worst", worst, "OK" if worst < 1e-4 and not bad else "BAD")
