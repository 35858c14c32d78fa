"""The scheduler's policy without a model: admission, batching, read-back lag, hand-outs,
retirement and cancellation, driven through the DecodeLoop over a simulated device.

The simulated device advances every running slot by one frame per step, and a sequence "samples"
its end at a frame the test chooses; its frames are (noise_key, index) pairs, so that a hand-out
can be checked against the frames the sequence made. The codes of the real model under the same
loop are checked in test_decode_loop.py.
"""

import dataclasses
import subprocess
import sys

import pytest

from engine.errors import Cancelled, InputError
from engine.runtime.decode_loop import DecodeLoop
from engine.runtime.scheduler import (ADMIT_GATHER_STEPS, ADMIT_MAX_DEFER_STEPS, ADMIT_MIN_LEAD_S, BLOCK,
                                      END_CHECK_STEPS, RAMP, RAMP_END, AllGraphs, Scheduler, SchedulerConfig,
                                      SequenceSpec)

from scheduling import run_until_idle, step

CAPACITY = 256
NUM_CODEBOOKS = 10


class Prompt:
    """Just the shape the scheduler reads."""

    def __init__(self, length: int):
        self.shape = (1 + NUM_CODEBOOKS, length)


def spec(key: int, frames: int = 24, prompt: int = 40, *, end_at: int | None = None) -> SequenceSpec:
    """A sequence of `frames` frames at most; end_at: the frame at which it samples <|im_end|>."""
    s = SequenceSpec(Prompt(prompt), 0.8, 0.8, 1.1, key, frames, stop_at_end=end_at is not None)
    s.end_at = end_at
    return s


class Counts:
    def __init__(self, length, done):
        self.length, self.done = list(length), list(done)
        self.waits = 0

    def wait(self):
        self.waits += 1
        return self.length, self.done


class SimulatedDevice:
    """BatchRunner's interface in plain Python."""

    def __init__(self, n_slots: int):
        self.active = [False] * n_slots
        self.specs: list[SequenceSpec | None] = [None] * n_slots
        self.made = [0] * n_slots  # frames made by the slot's sequence
        self.length = [0] * n_slots
        self.done = [0] * n_slots
        self.steps: list[tuple[int, int]] = []  # (rows, kv_needed) per step
        self.failing_keys: set[int] = set()  # admissions of these noise keys fail

    def stop(self, slots):
        for slot in slots:
            self.active[slot] = False

    def admit(self, admissions):
        started, failed = [], []
        for a in admissions:
            if a.spec.noise_key in self.failing_keys:
                failed.append((a.owner, RuntimeError("prefill failed")))
                continue
            self.active[a.slot], self.specs[a.slot] = True, a.spec
            self.made[a.slot] = self.length[a.slot] = self.done[a.slot] = 0
            started.append(a)
        return started, failed

    def step(self, rows, kv_needed):
        assert kv_needed <= CAPACITY
        self.steps.append((rows, kv_needed))
        for slot in range(rows):
            if self.active[slot]:
                self.made[slot] += 1
                end = self.specs[slot].end_at
                if not self.done[slot]:
                    if end is not None and self.made[slot] == end:
                        self.done[slot] = 1
                    else:
                        self.length[slot] += 1

    def copy_counts(self):
        return Counts(self.length, self.done)

    def frames(self, slot, start, end):
        return [(self.specs[slot].noise_key, i) for i in range(start, end)]


class Owner:
    """A sequence owner for the simulated device, whose frames are lists (scheduling.Collector's are tensors)."""

    def __init__(self):
        self.blocks, self.firsts, self.error, self.finished, self.cancelled = [], [], None, False, False

    def fail(self, exc):
        self.error = exc

    def take(self, codes, first, final):
        self.blocks.append(codes)
        self.firsts.append(first)
        self.finished = final

    @property
    def frames(self):
        return [f for block in self.blocks for f in block]


def loop_for(slots=4, graphs=None, frame_rate=None, clock=None, **config):
    config = SchedulerConfig(**{"read_back_lag": 1, "max_admit_per_step": 2, **config})
    options = {"frame_rate": frame_rate, **({"clock": clock} if clock else {})}
    scheduler = Scheduler(slots, CAPACITY, config, graphs, **options)
    return DecodeLoop(scheduler, SimulatedDevice(slots))


def expected_frames(s: SequenceSpec, n: int):
    return [(s.noise_key, i) for i in range(n)]


def test_the_scheduler_imports_no_torch():
    code = "import sys, engine.runtime.scheduler; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_sequence_gets_its_own_frames_in_ramp_blocks_among_others():
    loop = loop_for(4)
    specs = [spec(k) for k in range(6)]
    owners = [Owner() for _ in specs]
    arrivals = {0: [0, 1], 3: [2], 5: [3, 4, 5]}  # six sequences, four slots: some wait for a free one

    def arrive(i):
        for k in arrivals.get(i, []):
            loop.submit(specs[k], owners[k])

    run_until_idle(loop, arrive)
    for k, owner in enumerate(owners):
        assert owner.error is None and owner.finished
        assert owner.frames == expected_frames(specs[k], 24), f"sequence {k}"
        assert owner.firsts[0] and not any(owner.firsts[1:])
        assert [len(b) for b in owner.blocks] == [4, 8, 12]  # early first frames, then larger blocks
    assert loop.scheduler.free_slots == 4 and not loop.busy and not any(loop.runner.active)


def test_the_batch_covers_every_slot_in_use_and_the_longest_context():
    loop = loop_for(4)
    loop.submit(spec(1, prompt=30), Owner())
    loop.submit(spec(2, prompt=50), Owner())
    step(loop)
    assert loop.runner.steps == [(2, 50)]  # slots 0 and 1; the 50-column prompt's first step writes position 49
    step(loop)
    assert loop.runner.steps[-1] == (2, 51)


def test_a_longer_read_back_lag_hands_out_the_same_frames_later():
    def run(lag):
        loop = loop_for(4, read_back_lag=lag)
        specs = [spec(k) for k in range(6)]
        owners = [Owner() for _ in specs]
        first_out = {}

        def arrive(i):
            for k in {0: [0, 1], 3: [2], 5: [3, 4, 5]}.get(i, []):
                loop.submit(specs[k], owners[k])
            for k, owner in enumerate(owners):
                if owner.blocks and k not in first_out:
                    first_out[k] = i

        run_until_idle(loop, arrive)
        assert loop.scheduler.free_slots == 4 and not loop.busy and loop.scheduler.drained
        return owners, first_out

    (default, default_first), (lagged, lagged_first) = run(1), run(3)
    for a, b in zip(default, lagged, strict=True):
        assert [len(x) for x in a.blocks] == [len(x) for x in b.blocks] and a.frames == b.frames
    assert lagged_first[0] == default_first[0] + 2


def test_the_budget_leaves_room_for_the_steps_the_lag_runs_past_it():
    """No frame limit: the budget is what the context leaves, less the steps the lag runs past it."""
    for lag in (1, 3):
        loop, owner = loop_for(1, read_back_lag=lag), Owner()
        loop.submit(spec(1, frames=0, prompt=200), owner)
        run_until_idle(loop)
        assert len(owner.frames) == CAPACITY - 200 - (lag - 1)
        assert max(kv for _, kv in loop.runner.steps) <= CAPACITY


def test_a_stream_that_ends_between_its_blocks_is_found_within_a_few_steps():
    for lag in (1, 2):
        ended_at = RAMP_END + BLOCK // 2 + 1  # mid-block
        loop, owner = loop_for(1, read_back_lag=lag), Owner()
        loop.submit(spec(1, frames=4 * BLOCK, end_at=ended_at), owner)
        steps_before = 0
        while not owner.finished:
            step(loop)
            steps_before += 1
        assert steps_before <= ended_at + END_CHECK_STEPS + lag
        assert owner.frames == expected_frames(spec(1), ended_at - 1)  # <|im_end|> itself is not handed out
        assert loop.scheduler.free_slots == 1 and not loop.runner.active[0]


def test_after_a_failed_step_nothing_is_left_to_hand_out():
    loop = loop_for(2, read_back_lag=2)
    owners = [Owner() for _ in range(3)]
    for k, owner in enumerate(owners):
        loop.submit(spec(k), owner)
    for _ in range(RAMP[0] + 1):  # past the first hand-out: its read-back is queued
        step(loop)
    assert loop.scheduler._read_backs
    loop.fail_all(RuntimeError("injected"))
    assert not loop.busy and loop.scheduler.drained and loop.scheduler.free_slots == 2
    assert all(isinstance(o.error, RuntimeError) for o in owners) and not any(loop.runner.active)


def test_cancelling_frees_the_slot_at_the_next_step():
    loop = loop_for(2)
    keep, drop, waiting = Owner(), Owner(), Owner()
    loop.submit(spec(1), keep)
    loop.submit(spec(2), drop)
    step(loop)
    loop.submit(spec(3), waiting)
    step(loop)
    assert loop.scheduler.running == 2 and loop.scheduler.waiting == 1
    drop.cancelled = True
    step(loop)
    assert isinstance(drop.error, Cancelled) and not loop.runner.active[1]
    assert loop.scheduler.running + loop.scheduler.waiting == 2  # its slot is free at once
    for _ in range(ADMIT_GATHER_STEPS):  # the waiting sequence takes it once it waited for company
        step(loop)
    assert loop.scheduler.running == 2 and loop.scheduler.waiting == 0
    run_until_idle(loop)
    assert keep.frames == expected_frames(spec(1), 24) and waiting.frames == expected_frames(spec(3), 24)


def test_a_cancelled_waiting_sequence_never_runs():
    loop = loop_for(1)
    running, waiting = Owner(), Owner()
    loop.submit(spec(1), running)
    loop.submit(spec(2), waiting)
    step(loop)
    waiting.cancelled = True
    run_until_idle(loop)
    assert isinstance(waiting.error, Cancelled) and not waiting.blocks
    assert running.finished and running.error is None


def test_a_sequence_that_cannot_start_fails_alone():
    loop = loop_for(2)
    bad, good = Owner(), Owner()
    loop.submit(spec(1, prompt=CAPACITY + 5), bad)
    loop.submit(spec(2), good)
    run_until_idle(loop)
    assert isinstance(bad.error, ValueError) and "no room" in str(bad.error)
    assert good.finished and good.frames == expected_frames(spec(2), 24)


def test_a_sequence_whose_admission_fails_on_the_device_fails_alone():
    loop = loop_for(2)
    loop.runner.failing_keys.add(1)
    bad, good = Owner(), Owner()
    loop.submit(spec(1), bad)
    loop.submit(spec(2), good)
    run_until_idle(loop)
    assert isinstance(bad.error, RuntimeError) and not bad.blocks
    assert good.finished and good.error is None and loop.scheduler.free_slots == 2


def test_arrivals_while_others_run_wait_a_few_steps_to_be_admitted_together():
    loop = loop_for(4, max_admit_per_step=4)
    loop.submit(spec(0), Owner())
    step(loop)
    assert loop.scheduler.running == 1  # nothing ran: admitted at once
    loop.submit(spec(1), Owner())
    step(loop)
    loop.submit(spec(2), Owner())
    running = []
    for _ in range(ADMIT_GATHER_STEPS):
        step(loop)
        running.append(loop.scheduler.running)
    # Both in one admission, ADMIT_GATHER_STEPS steps after the first arrived (one step before the loop).
    assert running == [1] * (ADMIT_GATHER_STEPS - 1) + [3]
    loop.submit(spec(3), Owner(), front=True)  # a request's next text chunk: its listener waits
    step(loop)
    assert loop.scheduler.running == 4


def test_without_gathering_an_arrival_is_admitted_at_the_next_step():
    loop = loop_for(4, admit_gather_steps=0)
    loop.submit(spec(0), Owner())
    step(loop)
    loop.submit(spec(1), Owner())
    step(loop)
    assert loop.scheduler.running == 2


@pytest.mark.parametrize("settings", [{"read_back_lag": 0}, {"admit_gather_steps": -1}, {"admit_min_lead_s": -0.5},
                                      {"max_admit_per_step": 0}])
def test_scheduler_settings_out_of_range_are_refused(settings):
    with pytest.raises(InputError, match="must be"):
        SchedulerConfig(**settings)


def short_lead_loop():
    """A loop whose listeners are short of audio (lead under ADMIT_MIN_LEAD_S) after a first
    hand-out alone, with a clock the test moves."""
    now = [0.0]
    loop = loop_for(4, max_admit_per_step=4, frame_rate=RAMP[0] / (0.8 * ADMIT_MIN_LEAD_S), clock=lambda: now[0])
    return loop, now


def first_hand_out(loop, s, owner, front=False):
    loop.submit(s, owner, front=front)
    while not owner.blocks:
        step(loop)


def steps_to_admit(loop, s, owner, front=False, tick=None):
    """Queue the sequence (front=True: as a request's next text chunk; else straight behind any
    gathering, so that only listeners' lead can hold it back), then step until it runs; tick()
    before each step. Returns the steps that took."""
    if front:
        loop.submit(s, owner, front=True)
    else:
        loop.scheduler._waiting.append((s, owner, False))
    count = 0
    while not any(seq.owner is owner for seq in loop.scheduler._running.values()):
        if tick:
            tick()
        step(loop)
        count += 1
    return count


def test_arrivals_wait_for_the_second_hand_out_of_a_stream_whose_listener_is_short():
    loop, _ = short_lead_loop()
    owners = [Owner() for _ in range(3)]
    first_hand_out(loop, spec(0), owners[0])
    assert steps_to_admit(loop, spec(1), owners[1]) == RAMP[1] + 1  # the step after the 2nd hand-out
    assert len(owners[0].blocks) == 2
    while not owners[1].blocks:
        step(loop)
    assert steps_to_admit(loop, spec(2), owners[2]) == RAMP[1] + 1
    assert len(owners[1].blocks) == 2
    run_until_idle(loop)
    assert owners[1].frames == expected_frames(spec(1), 24)


def test_a_listener_falling_behind_holds_arrivals_back_for_a_bounded_number_of_steps():
    loop, now = short_lead_loop()
    first_hand_out(loop, spec(0), Owner())

    def tick():
        now[0] += 0.1

    assert steps_to_admit(loop, spec(1), Owner(), tick=tick) == ADMIT_MAX_DEFER_STEPS + 1


def test_a_min_lead_of_zero_admits_beside_a_short_listener_at_once():
    loop, _ = short_lead_loop()
    loop.scheduler.config = dataclasses.replace(loop.scheduler.config, admit_min_lead_s=0)
    first_hand_out(loop, spec(0), Owner())
    assert steps_to_admit(loop, spec(1), Owner()) == 1


def test_a_requests_next_text_chunk_neither_waits_for_short_listeners_nor_makes_others_wait():
    loop, _ = short_lead_loop()
    first_hand_out(loop, spec(0), Owner())
    assert steps_to_admit(loop, spec(1), Owner(), front=True) == 1  # a next chunk: at once
    loop, _ = short_lead_loop()
    first_hand_out(loop, spec(0), Owner(), front=True)  # its listener has the chunk before's audio
    assert steps_to_admit(loop, spec(1), Owner()) == 1


def test_a_stream_past_its_ramp_holds_no_one_back():
    loop, now = short_lead_loop()
    owner = Owner()
    first_hand_out(loop, spec(0, frames=4 * RAMP_END), owner)
    while len(owner.frames) < RAMP_END:
        step(loop)
    now[0] += 100.0
    assert steps_to_admit(loop, spec(1), Owner()) == 1


def test_more_sequences_than_captured_graphs_drain_the_batch_for_a_capture():
    graphs = AllGraphs(ready_slots=1, pending_batches=[2, 4])
    loop = loop_for(4, graphs=graphs, max_admit_per_step=4)
    owners = [Owner() for _ in range(3)]
    loop.submit(spec(0), owners[0])
    step(loop)
    assert loop.scheduler.running == 1 and not loop.scheduler.needs_capture  # batch 1's graphs serve it
    for k, owner in enumerate(owners[1:], start=1):
        loop.submit(spec(k), owner)
    assert loop.scheduler.needs_capture and loop.scheduler.demand == 3
    while not loop.scheduler.drained:  # while draining, nothing is admitted; the running sequence finishes
        step(loop)
        assert loop.scheduler.waiting == 2 and loop.scheduler.running <= 1
    assert owners[0].finished and owners[0].error is None
    graphs.ready_slots, graphs.pending_batches = 4, []  # the caller captured batches 2 and 4
    assert not loop.scheduler.needs_capture
    step(loop)
    assert loop.scheduler.running == 2 and loop.scheduler.waiting == 0
    run_until_idle(loop)
    assert all(o.finished and o.error is None for o in owners)


def test_without_graphs_for_more_rows_sequences_wait_for_a_free_captured_row():
    loop = loop_for(4, graphs=AllGraphs(ready_slots=2), max_admit_per_step=4)
    owners = [Owner() for _ in range(4)]
    for k, owner in enumerate(owners):
        loop.submit(spec(k), owner)
    most = 0

    def watch(i):
        nonlocal most
        most = max(most, loop.scheduler.running)

    run_until_idle(loop, watch)
    assert most == 2 and not loop.scheduler.needs_capture
    assert all(o.finished and o.error is None for o in owners)
