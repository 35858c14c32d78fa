"""Device helpers that do not need the device."""

import pytest
import torch

from engine.device import copy_may_overlap


@pytest.mark.parametrize("device, overlaps", [("cuda", True), ("cuda:1", True), ("mps", False), ("cpu", False),
                                              (torch.device("mps"), False)])
def test_host_copies_are_queued_only_where_the_source_is_staged_at_once(device, overlaps):
    # MPS reads a queued copy's pageable source after the call returns (pytorch/pytorch#139550).
    assert copy_may_overlap(device) is overlaps


@pytest.mark.parametrize("build, words", [(None, "built without CUDA"), ("13.0", "built for CUDA 13.0")])
def test_falling_back_to_the_cpu_says_why(monkeypatch, build, words):
    from engine.device import choose_placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", build)
    placement = choose_placement("auto", "auto")
    assert placement.device.type == "cpu" and words in placement.reason
