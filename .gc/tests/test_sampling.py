"""Top-p: the sort-free nucleus of the compiled batch-1 step keeps exactly the ids the sorted one keeps."""

import pytest
import torch

from engine.runtime.sampling import apply_top_p, outside_nucleus_pairwise, outside_nucleus_sorted


def _logits_with_ties(rows: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, width, generator=gen) * 3).bfloat16().float()  # bf16 logits: many exact ties
    logits[:, ::7] = float("-inf")  # masked ids (padding, the fast head's unused columns)
    return logits


def _top_p_between_cumulatives(logits: torch.Tensor, seed: int) -> torch.Tensor:
    """Per row, a top_p halfway between two successive cumulative probabilities, so that rounding
    differences between summation orders cannot move an id across the boundary."""
    cumulative = torch.sort(logits, descending=True, stable=True).values.softmax(-1).cumsum(-1)
    gen = torch.Generator().manual_seed(seed)
    k = torch.randint(0, 40, (logits.shape[0], 1), generator=gen)
    return ((cumulative.gather(1, k) + cumulative.gather(1, k + 1)) / 2)


@pytest.mark.parametrize("width", [1024, 4097])
def test_pairwise_nucleus_equals_the_sorted_one(width):
    logits = _logits_with_ties(6, width, seed=width)
    top_p = _top_p_between_cumulatives(logits, seed=1)
    sorted_remove = outside_nucleus_sorted(logits, top_p)
    assert sorted_remove.any() and (~sorted_remove).sum(-1).min() >= 1  # the check has something to compare
    assert torch.equal(outside_nucleus_pairwise(logits, top_p), sorted_remove)


def test_pairwise_nucleus_keeps_only_the_first_of_tied_maxima_when_top_p_is_tiny():
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0, float("-inf")]])
    expected = torch.tensor([[True, False, True, True, True]])
    for remove in (outside_nucleus_pairwise(logits, torch.tensor([[1e-6]])),
                   outside_nucleus_sorted(logits, torch.tensor([[1e-6]]))):
        assert torch.equal(remove, expected)


def test_the_compiled_batch1_step_takes_the_pairwise_path_and_agrees():
    logits = _logits_with_ties(1, 1024, seed=3)
    top_p = _top_p_between_cumulatives(logits, seed=4)
    calls = []
    traced = torch.compile(apply_top_p, backend=lambda gm, _: calls.append(gm) or gm, fullgraph=True)
    assert torch.equal(traced(logits, top_p), apply_top_p(logits, top_p))
    ops = {str(n.target) for n in calls[0].graph.nodes if n.op == "call_function"}
    assert not any("sort" in op for op in ops)  # pairwise when compiled: no sort in the graph
