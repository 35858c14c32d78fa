"""nucleus_kernel._outside_nucleus_one_row (tiled-nucleus.diff applied) in Triton's interpreter on the CPU,
against sampling.outside_nucleus_sorted and _pairwise: peaked rows with ties and masked ids (1,024, 4,097,
10 and 300 ids), flat rows with thousands of ids kept, tiny and whole top_p. Ranking ties the wrong way
round makes it print bad 5.

    patch -p1 < docs/benchmarks/session-s33/tiled-nucleus.diff
    TRITON_INTERPRET=1 PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s33/interpret_nucleus.py
"""
import sys
sys.path.insert(0, ".")
sys.path.insert(0, "tests")
import torch
from engine.runtime import nucleus_kernel as N
import builtins, numpy as np
def _int(x):
    data = getattr(getattr(x, "handle", x), "data", x)
    return int(np.asarray(data).reshape(-1)[0])
N.range = lambda *args: builtins.range(*[_int(a) for a in args])  # the interpreter's range() needs ints
from engine.runtime.sampling import outside_nucleus_pairwise, outside_nucleus_sorted
from test_sampling import _logits_with_ties, _top_p_between_cumulatives
bad = 0
for width in (1024, 4097, 10, 300):
    for seed in range(3):
        logits = _logits_with_ties(1, width, seed=width + seed)
        top_p = _top_p_between_cumulatives(logits, seed=seed) if width > 41 else torch.tensor([[0.5]])
        expected = outside_nucleus_sorted(logits, top_p)
        probs = logits.softmax(-1)
        remove = torch.empty_like(expected)
        bi = N.ids_a_program(width)
        N._outside_nucleus_one_row[(-(-width // bi),)](logits, probs, top_p.float(), remove, width, block_i=bi, block_j=N.BLOCK_J)
        same = torch.equal(remove, expected) and torch.equal(remove, outside_nucleus_pairwise(logits, top_p))
        bad += not same
        print(width, seed, "kept", int((~expected).sum()), "equal" if same else "DIFFERENT")
for width, k in ((4097, 2500), (1024, 700)):  # flat rows (random weights): many ids kept
    gen = torch.Generator().manual_seed(k)
    logits = (torch.randn(1, width, generator=gen) * 0.3).bfloat16().float()
    cumulative = torch.sort(logits, descending=True, stable=True).values.softmax(-1).cumsum(-1)
    top_p = (cumulative[:, k:k + 1] + cumulative[:, k + 1:k + 2]) / 2
    expected = outside_nucleus_sorted(logits, top_p)
    remove = torch.empty_like(expected)
    bi = N.ids_a_program(width)
    N._outside_nucleus_one_row[(-(-width // bi),)](logits, logits.softmax(-1), top_p, remove, width, block_i=bi, block_j=N.BLOCK_J)
    bad += not torch.equal(remove, expected)
    print(width, "flat, kept", int((~expected).sum()), "equal" if torch.equal(remove, expected) else "DIFFERENT")
for tp in (0.0, 1e-6, 1.0):  # the likeliest alone (first of tied maxima), and everything
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0, float("-inf")]])
    expected = outside_nucleus_sorted(logits, torch.tensor([[tp]]))
    remove = torch.empty_like(expected)
    N._outside_nucleus_one_row[(1,)](logits, logits.softmax(-1), torch.tensor([[tp]]), remove, 5, block_i=8, block_j=N.BLOCK_J)
    bad += not torch.equal(remove, expected)
    print(tp, remove.int().tolist(), expected.int().tolist())
print("bad", bad)
