"""The continuous-batching scheduler on the tiny fixture model (CPU, eager, fp32).

A sequence must get the same codes whether it runs alone or among others that come and go, with
or without its voice prefix served from the prefix cache; cancelled and failed sequences free
their slot at once without disturbing the rest."""

import hashlib

import pytest
import torch

from engine.compilation import CompilePolicy
from engine.errors import Cancelled
from engine.model.dual_ar import TokenLayout
from engine.model.loading import load_dual_ar
from engine.runtime.kv_cache import KVCache
from engine.runtime.prefix_cache import PrefixCache
from engine.runtime.scheduler import (ADMIT_GATHER_STEPS, ADMIT_MAX_DEFER_STEPS, ADMIT_MIN_LEAD_S, BLOCK,
                                      END_CHECK_STEPS, RAMP, RAMP_END,
                                      Scheduler, SequenceSpec)
from engine.runtime.step_runner import StepRunner
from engine.text.prompt import text_part, voice_prefix
from engine.text.tokenizer import S1Tokenizer

from scheduling import Collector, run_until_idle

EAGER = CompilePolicy(False, False, "test")
CAPACITY = 256


@pytest.fixture(scope="module")
def model(s1_dir, s1_expected):
    ids = s1_expected["special_ids"]
    return load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                        "cpu", torch.float32)


@pytest.fixture(scope="module")
def specs(s1_dir, s1_expected):
    """Six sequences: three texts in voice A (two references), two in voice B, one without a voice."""
    tok = S1Tokenizer.from_dir(s1_dir)
    refs = list(zip(s1_expected["prompt_b_ref_texts"], s1_expected["prompt_b_ref_codes"], strict=True))
    voices = {"A": refs, "B": refs[1:], None: []}
    plan = [("A", "The first sentence.", 0.8, 0.8, 1.2, 11), ("A", "Another one, longer than that.", 0.7, 0.9, 1.0, 12),
            ("B", "Voice B speaks.", 0.8, 0.8, 1.1, 13), (None, "No voice at all.", 0.9, 0.7, 1.3, 14),
            ("A", "A third text in voice A.", 0.8, 0.8, 1.2, 15), ("B", "B again.", 0.6, 0.95, 1.0, 16)]

    def make(voice, text, t, top_p, rp, seed, frames=24):
        prefix = voice_prefix(tok, voices[voice])
        prompt = torch.cat([prefix, text_part(tok, text)], dim=1).long()
        key = hashlib.sha1(prefix.numpy().tobytes()).hexdigest()
        return SequenceSpec(prompt, t, top_p, rp, seed, frames, prefix_key=key, prefix_length=prefix.shape[1],
                            stop_at_end=False)

    return [make(*p) for p in plan]


def scheduler_for(model, slots, prefix_bytes=1 << 30, read_back_lag=1):
    c = model.config
    cache = KVCache(c.n_layer, slots, c.n_local_heads, CAPACITY, c.head_dim, torch.float32, "cpu")
    return Scheduler(StepRunner(model, cache, EAGER), PrefixCache(cache, prefix_bytes), max_admit_per_step=2,
                     read_back_lag=read_back_lag)


def alone(model, spec):
    scheduler = scheduler_for(model, 1)
    owner = Collector()
    scheduler.submit(spec, owner)
    run_until_idle(scheduler)
    return owner


def test_a_sequence_gets_the_same_codes_alone_or_among_others(model, specs):
    scheduler = scheduler_for(model, 4)
    owners = [Collector() for _ in specs]
    arrivals = {0: [0, 1], 3: [2], 5: [3, 4, 5]}  # six sequences, four slots: some wait for a free one

    def arrive(i):
        for k in arrivals.get(i, []):
            scheduler.submit(specs[k], owners[k])

    run_until_idle(scheduler, arrive)
    assert scheduler.prefix_cache.hits >= 2  # voice A's and B's later sequences reused the prefix KV
    for k, spec in enumerate(specs):
        solo = alone(model, spec)
        assert owners[k].error is None and owners[k].finished
        assert owners[k].codes.shape == (10, spec.max_new_tokens)
        assert torch.equal(owners[k].codes, solo.codes), f"sequence {k}"
        assert owners[k].firsts[0] and not any(owners[k].firsts[1:])
        assert [b.shape[1] for b in owners[k].blocks] == [4, 8, 12]  # early first frames, then larger blocks
    assert not torch.equal(owners[0].codes, owners[4].codes)
    assert scheduler.free_slots == 4 and not scheduler.busy
    assert int(scheduler.runner.state.active.sum()) == 0


def test_a_longer_read_back_lag_hands_out_the_same_frames_later(model, specs):
    """Read-backs three steps behind: every sequence gets the same frames in the same blocks, each
    hand-out two iterations later than with the default lag of one, and every slot is freed."""
    def run(lag):
        scheduler = scheduler_for(model, 4, read_back_lag=lag)
        owners = [Collector() for _ in specs]
        first_out = {}

        def arrive(i):
            for k in {0: [0, 1], 3: [2], 5: [3, 4, 5]}.get(i, []):
                scheduler.submit(specs[k], owners[k])
            for k, owner in enumerate(owners):
                if owner.blocks and k not in first_out:
                    first_out[k] = i

        run_until_idle(scheduler, arrive)
        assert scheduler.free_slots == 4 and not scheduler.busy and scheduler.drained
        assert int(scheduler.runner.state.active.sum()) == 0
        return owners, first_out

    (default, default_first), (lagged, lagged_first) = run(1), run(3)
    for k, (a, b) in enumerate(zip(default, lagged, strict=True)):
        assert a.error is None and b.error is None and a.finished and b.finished
        assert [x.shape for x in a.blocks] == [x.shape for x in b.blocks], f"sequence {k}"
        assert torch.equal(a.codes, b.codes), f"sequence {k}"
    assert lagged_first[0] == default_first[0] + 2


def test_a_sequence_filling_the_context_stays_inside_it_with_a_longer_read_back_lag(model, specs):
    """No frame limit: the budget is what the context leaves, less the steps the lag runs past it,
    so the cache's last position is written and none beyond (the step would refuse a kv length
    past the capacity)."""
    spec = specs[3]
    unlimited = SequenceSpec(spec.prompt, spec.temperature, spec.top_p, spec.repetition_penalty, spec.noise_key, 0,
                             stop_at_end=False)
    results = {}
    for lag in (1, 3):
        scheduler, owner = scheduler_for(model, 1, read_back_lag=lag), Collector()
        scheduler.submit(unlimited, owner)
        run_until_idle(scheduler)
        assert owner.error is None and owner.finished
        results[lag] = owner.codes
    room = CAPACITY - spec.prompt.shape[1]
    assert results[1].shape[1] == room and results[3].shape[1] == room - 2
    assert torch.equal(results[3], results[1][:, : room - 2])


def test_after_a_failed_step_nothing_is_left_to_hand_out(model, specs):
    """fail_all fails every running and waiting sequence and drops the frame counts not yet read
    (with a lag of two, one step's are still queued): the scheduler is idle at once."""
    scheduler = scheduler_for(model, 2, read_back_lag=2)
    owners = [Collector() for _ in range(3)]
    for spec, owner in zip(specs[:3], owners):
        scheduler.submit(spec, owner)
    for _ in range(RAMP[0] + 1):  # past the first hand-out: its read-back is queued
        iterate(scheduler)
    assert scheduler._snapshots
    scheduler.fail_all(RuntimeError("injected"))
    assert not scheduler.busy and scheduler.drained and scheduler.free_slots == 2
    assert all(isinstance(o.error, RuntimeError) for o in owners)


def test_a_read_back_lag_below_one_is_refused(model):
    with pytest.raises(ValueError, match="read_back_lag must be at least 1"):
        scheduler_for(model, 1, read_back_lag=0)


@pytest.mark.parametrize("lag", [1, 2])
def test_a_stream_that_ends_between_its_blocks_is_found_within_a_few_steps(model, specs, lag):
    """Past its ramp a stream hands out every BLOCK steps, but the frame counts are read every
    END_CHECK_STEPS steps: a stream that sampled its end mid-block hands out its last frames and
    frees its slot within END_CHECK_STEPS steps (plus the read-back lag), not at its next block."""
    import dataclasses

    scheduler = scheduler_for(model, 1, read_back_lag=lag)
    owner = Collector()
    scheduler.submit(dataclasses.replace(specs[3], max_new_tokens=4 * BLOCK, stop_at_end=True), owner)
    ended_at = RAMP_END + BLOCK // 2 + 1  # mid-block
    while not (scheduler._running and scheduler._running[0].steps == ended_at):
        iterate(scheduler)
    state = scheduler.runner.state  # as if the last step had sampled <|im_end|>
    state.done[0], state.length[0] = True, ended_at - 1
    iterations = 0
    while not owner.finished:
        iterate(scheduler)
        iterations += 1
    assert iterations <= END_CHECK_STEPS + lag
    assert owner.codes.shape[1] == ended_at - 1 and scheduler.free_slots == 1


def test_prefix_cache_hit_gives_the_same_codes_as_a_miss(model, specs):
    scheduler = scheduler_for(model, 1)
    first, second = Collector(), Collector()
    scheduler.submit(specs[0], first)
    run_until_idle(scheduler)
    scheduler.submit(specs[0], second)
    run_until_idle(scheduler)
    assert scheduler.prefix_cache.stats()["hits"] == 1
    assert torch.equal(first.codes, second.codes)


def test_prefix_cache_evicts_to_its_budget(model, specs):
    c = model.config
    one_position = 2 * c.n_layer * c.n_local_heads * c.head_dim * 4
    scheduler = scheduler_for(model, 2, prefix_bytes=one_position * specs[0].prefix_length)
    for spec in (specs[0], specs[2], specs[0]):
        scheduler.submit(spec, Collector())
        run_until_idle(scheduler)
    cache = scheduler.prefix_cache
    assert len(cache) == 1 and cache.bytes <= cache.max_bytes
    assert cache.stats()["hits"] == 0  # voice A was evicted by voice B before it came back


def test_a_stored_prefix_is_placed_even_if_the_same_admission_evicts_it(model, specs):
    """Admitted together: voice A's second sequence finds A stored, then voice B's first prefills B
    and stores it, which evicts A (budget: one prefix) before the admission places A's copy."""
    c = model.config
    one_position = 2 * c.n_layer * c.n_local_heads * c.head_dim * 4
    budget = one_position * max(specs[0].prefix_length, specs[2].prefix_length)
    scheduler = scheduler_for(model, 2, prefix_bytes=budget)
    scheduler.submit(specs[0], Collector())
    run_until_idle(scheduler)
    scheduler.runner.cache.k.zero_()  # only a placed copy can bring voice A's prefix back to a slot
    scheduler.runner.cache.v.zero_()
    hit, miss = Collector(), Collector()
    scheduler.submit(specs[1], hit)
    scheduler.submit(specs[2], miss)
    run_until_idle(scheduler)
    cache = scheduler.prefix_cache
    assert cache.stats()["hits"] == 1 and len(cache) == 1  # A served once, then evicted by B
    for owner, spec in ((hit, specs[1]), (miss, specs[2])):
        assert owner.error is None and torch.equal(owner.codes, alone(model, spec).codes)


def test_a_prefix_copy_that_fails_fails_only_its_own_sequence(model, specs):
    scheduler = scheduler_for(model, 3)
    scheduler.max_admit_per_step = 3
    for spec in (specs[0], specs[2]):  # store voices A and B
        scheduler.submit(spec, Collector())
        run_until_idle(scheduler)
    place = scheduler.prefix_cache.place

    def place_failing_in_slot_1(rows):
        if any(slot == 1 for _, slot in rows):
            raise RuntimeError("copy failed")
        place(rows)

    scheduler.prefix_cache.place = place_failing_in_slot_1
    owners = [Collector() for _ in range(3)]
    for spec, owner in zip((specs[1], specs[5], specs[3]), owners, strict=True):  # A, B, no voice
        scheduler.submit(spec, owner)
    run_until_idle(scheduler)
    assert "copy failed" in str(owners[1].error)  # B's sequence, admitted second: slot 1
    for k, owner in ((1, owners[0]), (3, owners[2])):
        assert owner.error is None and torch.equal(owner.codes, alone(model, specs[k]).codes)
    assert scheduler.free_slots == 3 and not scheduler.busy


def test_placing_several_prefixes_in_one_call_equals_copying_each(model, specs):
    c = model.config
    cache = KVCache(c.n_layer, 3, c.n_local_heads, CAPACITY, c.head_dim, torch.float32, "cpu")
    prefixes = PrefixCache(cache, 1 << 30)
    stored = []
    for slot, length in ((0, 7), (1, 12)):
        cache.k[:, slot].normal_()
        cache.v[:, slot].normal_()
        prefixes.store(f"voice {slot}", slot, length)
        stored.append(prefixes.get(f"voice {slot}", length))
    assert prefixes.get("voice 1", 7) is None  # another length is another prefix
    expected_k, expected_v = cache.k.clone(), cache.v.clone()
    for (k, v), slot in ((stored[0], 2), (stored[1], 0)):
        expected_k[:, slot, :, :k.shape[2]] = k
        expected_v[:, slot, :, :v.shape[2]] = v
    prefixes.place([(stored[0], 2), (stored[1], 0)])
    assert torch.equal(cache.k, expected_k) and torch.equal(cache.v, expected_v)
    assert prefixes.stats()["hits"] == 2 and prefixes.stats()["misses"] == 1


def test_cancelling_frees_the_slot_at_the_next_iteration(model, specs):
    scheduler = scheduler_for(model, 2)
    keep, drop, waiting = Collector(), Collector(), Collector()
    scheduler.submit(specs[0], keep)
    scheduler.submit(specs[1], drop)
    scheduler.iteration()
    scheduler.submit(specs[2], waiting)
    scheduler.iteration()
    assert scheduler.running == 2 and scheduler.waiting == 1
    drop.cancelled = True
    scheduler.iteration()
    assert isinstance(drop.error, Cancelled)
    assert scheduler.running + scheduler.waiting == 2  # its slot is free at once
    for _ in range(ADMIT_GATHER_STEPS):  # the waiting sequence takes it once it waited for company
        for h in scheduler.iteration():
            h.owner.take(h.codes, h.first, h.final)
    assert scheduler.running == 2 and scheduler.waiting == 0
    run_until_idle(scheduler)
    assert torch.equal(keep.codes, alone(model, specs[0]).codes)
    assert torch.equal(waiting.codes, alone(model, specs[2]).codes)


def test_arrivals_while_others_run_wait_a_few_steps_to_be_admitted_together(model, specs):
    scheduler = scheduler_for(model, 4)
    scheduler.max_admit_per_step = 4
    owners = [Collector() for _ in range(4)]
    scheduler.submit(specs[0], owners[0])
    scheduler.iteration()
    assert scheduler.running == 1  # nothing ran: admitted at once
    scheduler.submit(specs[1], owners[1])
    scheduler.iteration()
    scheduler.submit(specs[2], owners[2])
    running = []
    for _ in range(ADMIT_GATHER_STEPS):
        scheduler.iteration()
        running.append(scheduler.running)
    # Both in one admission, ADMIT_GATHER_STEPS steps after the first arrived (one step before the loop).
    assert running == [1] * (ADMIT_GATHER_STEPS - 1) + [3]
    scheduler.submit(specs[3], owners[3], front=True)  # a request's next text chunk: its listener waits
    scheduler.iteration()
    assert scheduler.running == 4


def test_without_gathering_an_arrival_is_admitted_at_the_next_iteration(model, specs):
    scheduler = scheduler_for(model, 4)
    scheduler.admit_gather_steps = 0
    scheduler.submit(specs[0], Collector())
    scheduler.iteration()
    scheduler.submit(specs[1], Collector())
    scheduler.iteration()
    assert scheduler.running == 2


def test_admission_settings_below_zero_are_refused(model):
    with pytest.raises(ValueError, match="must be >= 0"):
        Scheduler(scheduler_for(model, 1).runner, admit_gather_steps=-1)
    with pytest.raises(ValueError, match="must be >= 0"):
        Scheduler(scheduler_for(model, 1).runner, admit_min_lead_s=-0.5)


def iterate(scheduler):
    for h in scheduler.iteration():
        h.owner.take(h.codes, h.first, h.final)


def short_lead_scheduler(model):
    """A scheduler whose listeners are short of audio (lead under ADMIT_MIN_LEAD_S) after a first
    hand-out alone, with a clock the test moves."""
    now = [0.0]
    scheduler = scheduler_for(model, 4)
    scheduler.max_admit_per_step = 4
    scheduler.frame_rate, scheduler.clock = RAMP[0] / (0.8 * ADMIT_MIN_LEAD_S), lambda: now[0]
    return scheduler, now


def first_hand_out(scheduler, spec, owner, front=False):
    scheduler.submit(spec, owner, front=front)
    while not owner.blocks:
        iterate(scheduler)


def iterations_to_admit(scheduler, spec, owner, front=False, tick=None):
    """Queue the sequence (front=True: as a request's next text chunk; else straight behind any
    gathering, so that only listeners' lead can hold it back), then iterate until it runs; tick()
    before each iteration. Returns the iterations that took."""
    if front:
        scheduler.submit(spec, owner, front=True)
    else:
        scheduler._waiting.append((spec, owner, False))
    count = 0
    while not any(seq.owner is owner for seq in scheduler._running.values()):
        if tick:
            tick()
        iterate(scheduler)
        count += 1
    return count


def test_arrivals_wait_for_the_second_hand_out_of_a_stream_whose_listener_is_short(model, specs):
    """After its first hand-out (RAMP[0] frames, under ADMIT_MIN_LEAD_S of audio) a stream makes a
    new request wait for its second one; then the newcomer, once handed out, makes the next wait
    as long (the count of deferred steps starts again from an empty queue). Waiting changes no
    codes."""
    scheduler, _ = short_lead_scheduler(model)
    owners = [Collector() for _ in range(3)]
    first_hand_out(scheduler, specs[0], owners[0])
    assert iterations_to_admit(scheduler, specs[1], owners[1]) == RAMP[1] + 1  # the iteration after the 2nd hand-out
    assert len(owners[0].blocks) == 2
    while not owners[1].blocks:
        iterate(scheduler)
    assert iterations_to_admit(scheduler, specs[2], owners[2]) == RAMP[1] + 1
    assert len(owners[1].blocks) == 2
    run_until_idle(scheduler)
    alone = scheduler_for(model, 4)
    collector = Collector()
    alone.submit(specs[1], collector)
    run_until_idle(alone)
    assert torch.equal(owners[1].codes, collector.codes)


def test_a_listener_falling_behind_holds_arrivals_back_for_a_bounded_number_of_steps(model, specs):
    """With the stream slower than real time (a tenth of a second per step: 10 frames/s, its listener
    plays 20), its lead never recovers: an arrival waits ADMIT_MAX_DEFER_STEPS steps, then is
    admitted. (The lead is counted from the first hand-out: were it counted from each, the second
    hand-out would let the arrival in.)"""
    scheduler, now = short_lead_scheduler(model)
    first_hand_out(scheduler, specs[0], Collector())

    def tick():
        now[0] += 0.1

    assert iterations_to_admit(scheduler, specs[1], Collector(), tick=tick) == ADMIT_MAX_DEFER_STEPS + 1


def test_a_min_lead_of_zero_admits_beside_a_short_listener_at_once(model, specs):
    scheduler, _ = short_lead_scheduler(model)
    scheduler.admit_min_lead_s = 0
    first_hand_out(scheduler, specs[0], Collector())
    assert iterations_to_admit(scheduler, specs[1], Collector()) == 1


def test_a_requests_next_text_chunk_neither_waits_for_short_listeners_nor_makes_others_wait(model, specs):
    scheduler, _ = short_lead_scheduler(model)
    first_hand_out(scheduler, specs[0], Collector())
    assert iterations_to_admit(scheduler, specs[1], Collector(), front=True) == 1  # a next chunk: at once
    scheduler, _ = short_lead_scheduler(model)
    first_hand_out(scheduler, specs[0], Collector(), front=True)  # its listener has the chunk before's audio
    assert iterations_to_admit(scheduler, specs[1], Collector()) == 1


def test_a_stream_past_its_ramp_holds_no_one_back(model, specs):
    """Once a stream has handed out its ramp (RAMP_END frames), a short lead (a listener ahead of
    it: the stream is slower than real time) no longer defers admission: deferring cannot help it."""
    import dataclasses

    scheduler, now = short_lead_scheduler(model)
    owner = Collector()
    first_hand_out(scheduler, dataclasses.replace(specs[0], max_new_tokens=4 * RAMP_END), owner)
    while sum(block.shape[1] for block in owner.blocks) < RAMP_END:
        iterate(scheduler)
    now[0] += 100.0
    assert iterations_to_admit(scheduler, specs[1], Collector()) == 1


def test_a_cancelled_waiting_sequence_never_runs(model, specs):
    scheduler = scheduler_for(model, 1)
    running, waiting = Collector(), Collector()
    scheduler.submit(specs[0], running)
    scheduler.submit(specs[1], waiting)
    scheduler.iteration()
    waiting.cancelled = True
    run_until_idle(scheduler)
    assert isinstance(waiting.error, Cancelled) and not waiting.blocks
    assert running.finished and running.error is None


def test_a_sequence_that_cannot_start_fails_alone(model, specs):
    scheduler = scheduler_for(model, 2)
    too_long = SequenceSpec(torch.zeros(11, CAPACITY + 5, dtype=torch.long), 0.8, 0.8, 1.0, 1, 10)
    bad, good = Collector(), Collector()
    scheduler.submit(too_long, bad)
    scheduler.submit(specs[3], good)
    run_until_idle(scheduler)
    assert isinstance(bad.error, ValueError) and "no room" in str(bad.error)
    assert good.finished and torch.equal(good.codes, alone(model, specs[3]).codes)


def test_a_sequence_whose_prefill_fails_in_a_batch_fails_alone(model, specs, monkeypatch):
    scheduler = scheduler_for(model, 2)
    runner = scheduler.runner
    plain_prefill, batches = runner.prefill, []

    def prefill(slot, prompt, start=0, end=None):  # the row of specs[3] cannot be prefilled
        if prompt is specs[3].prompt:
            raise RuntimeError("prefill failed")
        plain_prefill(slot, prompt, start, end)

    def prefill_rows(rows):
        batches.append(len(rows))
        raise RuntimeError("batched prefill failed")

    monkeypatch.setattr(runner, "prefill", prefill)
    monkeypatch.setattr(runner, "_prefill_rows", prefill_rows)
    bad, good = Collector(), Collector()
    scheduler.submit(specs[3], bad)
    scheduler.submit(specs[1], good)
    run_until_idle(scheduler)
    assert batches == [2]
    assert isinstance(bad.error, RuntimeError) and not bad.blocks
    assert good.finished and good.error is None and torch.equal(good.codes, alone(model, specs[1]).codes)
    assert scheduler.free_slots == 2 and not scheduler.busy


def test_a_sequence_whose_decode_state_cannot_start_in_a_batch_fails_alone(model, specs, monkeypatch):
    scheduler = scheduler_for(model, 2)
    state = scheduler.runner.state
    plain_start_many, batches = state.start_many, []

    def start_many(rows):  # the row of specs[3] cannot start
        batches.append(len(rows))
        if any(column.data_ptr() == specs[3].prompt[:, -1].data_ptr() for _, column, *_ in rows):
            raise RuntimeError("start failed")
        plain_start_many(rows)

    monkeypatch.setattr(state, "start_many", start_many)
    bad, good = Collector(), Collector()
    scheduler.submit(specs[3], bad)
    scheduler.submit(specs[1], good)
    run_until_idle(scheduler)
    assert batches == [2, 1, 1]
    assert isinstance(bad.error, RuntimeError) and not bad.blocks
    assert good.finished and good.error is None and torch.equal(good.codes, alone(model, specs[1]).codes)
    assert scheduler.free_slots == 2 and not scheduler.busy


class PartlyCaptured(StepRunner):
    """A runner whose graphs exist for `ready_slots` rows so far, with `pending` batch buckets to capture."""

    pending: list[int] = []

    @property
    def pending_batches(self) -> list[int]:
        return self.pending


def partly_captured_scheduler(model, slots, ready, pending):
    c = model.config
    cache = KVCache(c.n_layer, slots, c.n_local_heads, CAPACITY, c.head_dim, torch.float32, "cpu")
    runner = PartlyCaptured(model, cache, EAGER)
    runner.ready_slots, runner.pending = ready, pending
    return Scheduler(runner, PrefixCache(cache, 1 << 30), max_admit_per_step=4)


def test_more_sequences_than_captured_graphs_drain_the_batch_for_a_capture(model, specs):
    scheduler = partly_captured_scheduler(model, 4, ready=1, pending=[2, 4])
    owners = [Collector() for _ in range(3)]
    scheduler.submit(specs[0], owners[0])
    scheduler.iteration()
    assert scheduler.running == 1 and not scheduler.needs_capture  # one sequence: batch 1's graphs serve it
    for spec, owner in zip(specs[1:3], owners[1:], strict=True):
        scheduler.submit(spec, owner)
    assert scheduler.needs_capture and scheduler.demand == 3
    # While draining, nothing is admitted; the running sequence finishes.
    while not scheduler.drained:
        for h in scheduler.iteration():
            h.owner.take(h.codes, h.first, h.final)
        assert scheduler.waiting == 2 and scheduler.running <= 1
    assert owners[0].finished and owners[0].error is None
    # The caller captures batches 2 and 4: both waiting sequences run together.
    scheduler.runner.ready_slots, scheduler.runner.pending = 4, []
    assert not scheduler.needs_capture
    scheduler.iteration()
    assert scheduler.running == 2 and scheduler.waiting == 0
    run_until_idle(scheduler, lambda i: None)
    assert all(o.finished and o.error is None for o in owners)


def test_without_graphs_for_more_rows_sequences_wait_for_a_free_captured_row(model, specs):
    """A capture failed (nothing pending): at most `ready` sequences run, the rest wait their turn."""
    scheduler = partly_captured_scheduler(model, 4, ready=2, pending=[])
    owners = [Collector() for _ in range(4)]
    for spec, owner in zip(specs, owners, strict=False):
        scheduler.submit(spec, owner)
    most = 0

    def watch(i):
        nonlocal most
        most = max(most, scheduler.running)

    run_until_idle(scheduler, watch)
    assert most == 2 and not scheduler.needs_capture
    assert all(o.finished and o.error is None for o in owners)
