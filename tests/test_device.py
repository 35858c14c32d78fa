"""Device helpers that do not need the device."""

import pytest
import torch

from engine.device import copy_may_overlap


@pytest.mark.parametrize("device, overlaps", [("cuda", True), ("cuda:1", True), ("mps", False), ("cpu", False),
                                              (torch.device("mps"), False)])
def test_host_copies_are_queued_only_where_the_source_is_staged_at_once(device, overlaps):
    # MPS reads a queued copy's pageable source after the call returns (pytorch/pytorch#139550).
    assert copy_may_overlap(device) is overlaps
