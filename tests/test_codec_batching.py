"""CodecBatcher: which harvests go to the codec at once and which wait for company."""

import torch

from engine.runtime.codec_batching import CodecBatcher
from engine.runtime.scheduler import BLOCK, RAMP, Harvest


def harvest(slot: int, frames: int = BLOCK, first: bool = False, final: bool = False) -> Harvest:
    return Harvest(owner=f"owner{slot}", slot=slot, codes=torch.full((10, frames), slot), first=first, final=final)


def routed(calls: list[list[Harvest]]) -> list[list[int]]:
    return [[h.slot for h in call] for call in calls]


def test_first_and_ramp_hand_outs_go_at_once_blocks_and_last_frames_wait():
    batcher = CodecBatcher(max_hold=8, target_rows=64)
    calls = batcher.route([harvest(0, RAMP[0], first=True), harvest(1, RAMP[1]), harvest(2, RAMP[2]),
                           harvest(3), harvest(4, 5, final=True)], company=10)
    assert routed(calls) == [[0, 1, 2]]
    assert batcher.holding


def test_held_harvests_go_after_max_hold_iterations_with_what_is_due_then():
    batcher = CodecBatcher(max_hold=3, target_rows=64)
    assert batcher.route([harvest(0)], company=10) == []
    assert batcher.route([harvest(1, final=True)], company=10) == []
    assert batcher.route([], company=10) == []
    calls = batcher.route([harvest(2, RAMP[0], first=True), harvest(3)], company=10)
    assert routed(calls) == [[2, 0, 1, 3]]  # one call: the due hand-out, then everything held
    assert not batcher.holding


def test_held_harvests_go_once_target_rows_wait():
    batcher = CodecBatcher(max_hold=8, target_rows=3)
    assert batcher.route([harvest(0), harvest(1)], company=10) == []
    assert routed(batcher.route([harvest(2)], company=10)) == [[0, 1, 2]]


def test_nothing_waits_without_company_or_with_max_hold_zero():
    batcher = CodecBatcher(max_hold=8, target_rows=64)
    assert batcher.route([harvest(0)], company=10) == []
    assert routed(batcher.route([harvest(1, final=True)], company=1)) == [[1, 0]]  # the held one goes too
    assert routed(CodecBatcher(max_hold=0, target_rows=64).route([harvest(0), harvest(1, final=True)], company=10)) \
        == [[0, 1]]


def test_a_row_with_held_frames_sends_them_before_its_next_ones():
    """A stream's last frames soon after its held block, and a new stream's first frames in the row of
    a held last chunk (they reset the row): the held ones are decoded first, in a call of their own."""
    batcher = CodecBatcher(max_hold=8, target_rows=64)
    batcher.route([harvest(0), harvest(1, 7, final=True)], company=10)
    calls = batcher.route([harvest(0, 3, final=True), harvest(2, RAMP[0], first=True)], company=10)
    assert routed(calls) == [[0, 1], [2]]
    assert batcher.holding  # slot 0's last frames wait in turn
    calls = batcher.route([harvest(1, RAMP[0], first=True), harvest(0, RAMP[0], first=True)], company=10)
    assert routed(calls) == [[0], [1, 0]]  # slot 0's last frames, then the new stream there


def test_a_held_harvest_keeps_its_frames_when_the_slot_moves_on():
    batcher = CodecBatcher(max_hold=1, target_rows=64)
    block = harvest(0)
    batcher.route([block], company=10)
    block.codes.fill_(-1)  # the slot's frame buffer, reused by the next iteration
    (call,) = batcher.route([], company=10)
    assert torch.equal(call[0].codes, torch.zeros(10, BLOCK, dtype=call[0].codes.dtype))


def test_discard_returns_the_held_harvests_owners():
    batcher = CodecBatcher(max_hold=8, target_rows=64)
    batcher.route([harvest(0), harvest(1, final=True)], company=10)
    assert batcher.discard() == ["owner0", "owner1"]
    assert not batcher.holding
