"""decode_attention with fold-merge.diff applied, in Triton's interpreter on the CPU (fp32):

    git apply docs/benchmarks/session-s32/fold-merge.diff
    TRITON_INTERPRET=1 python docs/benchmarks/session-s32/interpret_fold_merge.py   # needs the triton package; no GPU

The splits merged by their last program (tickets) against the merge kernel, for several batches and
key counts: the outputs must be equal bit for bit and the tickets zero afterwards. The interpreter
runs programs one after another, so this checks the merge's arithmetic and the ticket count, not
the memory ordering between programs (that needs the GPU tests). (interpreted_attention.py: the
interpreter's range().)
"""
import sys

import torch

sys.path.insert(0, "docs/benchmarks/session-s32")
from interpreted_attention import decode_attention as A  # noqa: E402
from engine.model.dual_ar import Attention, rope_table  # noqa: E402

torch.manual_seed(0)
H, KV, D, cap = 4, 2, 16, 1024
attn = Attention(H * D, H, KV, D, 1e-6, True, False, False)
attn.requires_grad_(False)
bad = 0
for batch, n_keys, one_row in [(1, 512, True), (1, 300, True), (3, 700, False), (5, 1024, False)]:
    qkv = torch.randn(batch, (H + 2 * KV) * D)
    k_cache, v_cache = torch.randn(batch, KV, cap, D), torch.randn(batch, KV, cap, D)
    positions = torch.randint(0, n_keys, (batch,))
    positions[-1] = n_keys - 1
    rope = rope_table(cap, D, 1e6)[positions]
    tickets = torch.zeros(batch * KV, dtype=torch.int32)

    def run(t):
        k, v = k_cache.clone(), v_cache.clone()
        out = A.launch(A._attend_split, A._merge_splits, qkv, *attn.kernel_norms(), rope.reshape(batch, -1), k, v,
                       positions, n_keys, H, one_row, t)
        return out, k, v

    folded, merged = run(tickets), run(None)
    same = all(torch.equal(a, b) for a, b in zip(folded, merged, strict=True)) and not tickets.any()
    bad += not same
    print(batch, n_keys, "equal, tickets zero" if same else "DIFFERENT", (folded[0] - merged[0]).abs().max().item())
print("bad", bad)
