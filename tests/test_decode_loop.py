"""The engine's decode loop (loop and batch runner) on the tiny fixture model (CPU, eager, fp32).

A sequence must get the same codes whether it runs alone or among others that come and go, with
or without its voice prefix served from the prefix cache; cancelled and failed sequences free
their slot at once without disturbing the rest."""

import dataclasses
import hashlib

import pytest
import torch

from engine.compilation import CompilePolicy
from engine.errors import Cancelled
from engine.model.dual_ar import TokenLayout
from engine.model.loading import load_dual_ar
from engine.runtime.kv_cache import KVCache
from engine.runtime.prefix_cache import PrefixCache
from engine.runtime.decode_loop import DecodeLoop
from engine.runtime.scheduler import (ADMIT_GATHER_STEPS, BLOCK,
                                      END_CHECK_STEPS, RAMP, RAMP_END, SchedulerConfig, SequenceSpec)
from engine.runtime.step_runner import StepRunner
from engine.text.prompt import text_part, voice_prefix
from engine.text.tokenizer import S1Tokenizer

from scheduling import Collector, run_until_idle, step

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


def scheduler_for(model, slots, prefix_bytes=1 << 30, read_back_lag=1, **config):
    """A decode loop over `slots` slots of the fixture model."""
    c = model.config
    cache = KVCache(c.n_layer, slots, c.n_local_heads, CAPACITY, c.head_dim, torch.float32, "cpu")
    config = SchedulerConfig(read_back_lag=read_back_lag, **{"max_admit_per_step": 2, **config})
    return DecodeLoop.over(StepRunner(model, cache, EAGER), PrefixCache(cache, prefix_bytes), config)


def reconfigure(loop, **changes):
    loop.scheduler.config = dataclasses.replace(loop.scheduler.config, **changes)


def alone(model, spec):
    loop = scheduler_for(model, 1)
    owner = Collector()
    loop.submit(spec, owner)
    run_until_idle(loop)
    return owner


def test_a_sequence_gets_the_same_codes_alone_or_among_others(model, specs):
    loop = scheduler_for(model, 4)
    owners = [Collector() for _ in specs]
    arrivals = {0: [0, 1], 3: [2], 5: [3, 4, 5]}  # six sequences, four slots: some wait for a free one

    def arrive(i):
        for k in arrivals.get(i, []):
            loop.submit(specs[k], owners[k])

    run_until_idle(loop, arrive)
    assert loop.runner.prefix_cache.hits >= 2  # voice A's and B's later sequences reused the prefix KV
    for k, spec in enumerate(specs):
        solo = alone(model, spec)
        assert owners[k].error is None and owners[k].finished
        assert owners[k].codes.shape == (10, spec.max_new_tokens)
        assert torch.equal(owners[k].codes, solo.codes), f"sequence {k}"
        assert owners[k].firsts[0] and not any(owners[k].firsts[1:])
        assert [b.shape[1] for b in owners[k].blocks] == [4, 8, 12]  # early first frames, then larger blocks
    assert not torch.equal(owners[0].codes, owners[4].codes)
    assert loop.scheduler.free_slots == 4 and not loop.busy
    assert int(loop.runner.state.active.sum()) == 0


def test_a_longer_read_back_lag_hands_out_the_same_frames_later(model, specs):
    """Read-backs three steps behind: every sequence gets the same frames in the same blocks, each
    hand-out two iterations later than with the default lag of one, and every slot is freed."""
    def run(lag):
        loop = scheduler_for(model, 4, read_back_lag=lag)
        owners = [Collector() for _ in specs]
        first_out = {}

        def arrive(i):
            for k in {0: [0, 1], 3: [2], 5: [3, 4, 5]}.get(i, []):
                loop.submit(specs[k], owners[k])
            for k, owner in enumerate(owners):
                if owner.blocks and k not in first_out:
                    first_out[k] = i

        run_until_idle(loop, arrive)
        assert loop.scheduler.free_slots == 4 and not loop.busy and loop.scheduler.drained
        assert int(loop.runner.state.active.sum()) == 0
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
        loop, owner = scheduler_for(model, 1, read_back_lag=lag), Collector()
        loop.submit(unlimited, owner)
        run_until_idle(loop)
        assert owner.error is None and owner.finished
        results[lag] = owner.codes
    room = CAPACITY - spec.prompt.shape[1]
    assert results[1].shape[1] == room and results[3].shape[1] == room - 2
    assert torch.equal(results[3], results[1][:, : room - 2])


def test_after_a_failed_step_nothing_is_left_to_hand_out(model, specs):
    """fail_all fails every running and waiting sequence and drops the frame counts not yet read
    (with a lag of two, one step's are still queued): the loop is idle at once."""
    loop = scheduler_for(model, 2, read_back_lag=2)
    owners = [Collector() for _ in range(3)]
    for spec, owner in zip(specs[:3], owners):
        loop.submit(spec, owner)
    for _ in range(RAMP[0] + 1):  # past the first hand-out: its read-back is queued
        step(loop)
    assert loop.scheduler._read_backs
    loop.fail_all(RuntimeError("injected"))
    assert not loop.busy and loop.scheduler.drained and loop.scheduler.free_slots == 2
    assert all(isinstance(o.error, RuntimeError) for o in owners)


@pytest.mark.parametrize("lag", [1, 2])
def test_a_stream_that_ends_between_its_blocks_is_found_within_a_few_steps(model, specs, lag):
    """Past its ramp a stream hands out every BLOCK steps, but the frame counts are read every
    END_CHECK_STEPS steps: a stream that sampled its end mid-block hands out its last frames and
    frees its slot within END_CHECK_STEPS steps (plus the read-back lag), not at its next block."""
    loop = scheduler_for(model, 1, read_back_lag=lag)
    owner = Collector()
    loop.submit(dataclasses.replace(specs[3], max_new_tokens=4 * BLOCK, stop_at_end=True), owner)
    ended_at = RAMP_END + BLOCK // 2 + 1  # mid-block
    while not (loop.scheduler._running and loop.scheduler._running[0].steps == ended_at):
        step(loop)
    state = loop.runner.state  # as if the last step had sampled <|im_end|>
    state.done[0], state.length[0] = True, ended_at - 1
    iterations = 0
    while not owner.finished:
        step(loop)
        iterations += 1
    assert iterations <= END_CHECK_STEPS + lag
    assert owner.codes.shape[1] == ended_at - 1 and loop.scheduler.free_slots == 1


def test_prefix_cache_hit_gives_the_same_codes_as_a_miss(model, specs):
    loop = scheduler_for(model, 1)
    first, second = Collector(), Collector()
    loop.submit(specs[0], first)
    run_until_idle(loop)
    loop.submit(specs[0], second)
    run_until_idle(loop)
    assert loop.runner.prefix_cache.stats()["hits"] == 1
    assert torch.equal(first.codes, second.codes)


def test_new_voices_admitted_together_prefill_their_prefixes_in_one_call(model, specs):
    """Voices A and B, new, and a second sequence of A, admitted together: one prefill call holds
    A's and B's prefixes (one row per voice), the second A copies A's, and each sequence gets the
    codes it gets alone."""
    loop = scheduler_for(model, 3)
    reconfigure(loop, max_admit_per_step=3)
    runner = loop.runner.step_runner
    calls, prefill_many = [], runner.prefill_many

    def recording(rows):
        calls.append([(slot, prompt.shape[1], start) for slot, prompt, start in rows])
        prefill_many(rows)

    runner.prefill_many = recording
    owners = [Collector() for _ in range(3)]
    for spec, owner in zip((specs[0], specs[2], specs[1]), owners, strict=True):  # A, B, A
        loop.submit(spec, owner)
    run_until_idle(loop)
    prefixes = [specs[0].prefix_length + 1, specs[2].prefix_length + 1]
    assert calls[0] == [(0, prefixes[0], 0), (1, prefixes[1], 0)]  # both new voices' prefixes, one call
    assert [start for _, _, start in calls[1]] == [specs[0].prefix_length, specs[2].prefix_length,
                                                   specs[1].prefix_length]  # then the texts
    assert loop.runner.prefix_cache.stats()["hits"] == 1  # the second A
    for owner, k in zip(owners, (0, 2, 1), strict=True):
        assert owner.error is None and torch.equal(owner.codes, alone(model, specs[k]).codes)


def test_prefix_cache_evicts_to_its_budget(model, specs):
    c = model.config
    one_position = 2 * c.n_layer * c.n_local_heads * c.head_dim * 4
    loop = scheduler_for(model, 2, prefix_bytes=one_position * specs[0].prefix_length)
    for spec in (specs[0], specs[2], specs[0]):
        loop.submit(spec, Collector())
        run_until_idle(loop)
    cache = loop.runner.prefix_cache
    assert len(cache) == 1 and cache.bytes <= cache.max_bytes
    assert cache.stats()["hits"] == 0  # voice A was evicted by voice B before it came back


def test_a_stored_prefix_is_placed_even_if_the_same_admission_evicts_it(model, specs):
    """Admitted together: voice A's second sequence finds A stored, then voice B's first prefills B
    and stores it, which evicts A (budget: one prefix) before the admission places A's copy."""
    c = model.config
    one_position = 2 * c.n_layer * c.n_local_heads * c.head_dim * 4
    budget = one_position * max(specs[0].prefix_length, specs[2].prefix_length)
    loop = scheduler_for(model, 2, prefix_bytes=budget)
    loop.submit(specs[0], Collector())
    run_until_idle(loop)
    loop.runner.step_runner.cache.k.zero_()  # only a placed copy can bring voice A's prefix back to a slot
    loop.runner.step_runner.cache.v.zero_()
    hit, miss = Collector(), Collector()
    loop.submit(specs[1], hit)
    loop.submit(specs[2], miss)
    run_until_idle(loop)
    cache = loop.runner.prefix_cache
    assert cache.stats()["hits"] == 1 and len(cache) == 1  # A served once, then evicted by B
    for owner, spec in ((hit, specs[1]), (miss, specs[2])):
        assert owner.error is None and torch.equal(owner.codes, alone(model, spec).codes)


def test_a_prefix_copy_that_fails_fails_only_its_own_sequence(model, specs):
    loop = scheduler_for(model, 3)
    reconfigure(loop, max_admit_per_step=3)
    for spec in (specs[0], specs[2]):  # store voices A and B
        loop.submit(spec, Collector())
        run_until_idle(loop)
    place = loop.runner.prefix_cache.place

    def place_failing_in_slot_1(rows):
        if any(slot == 1 for _, slot in rows):
            raise RuntimeError("copy failed")
        place(rows)

    loop.runner.prefix_cache.place = place_failing_in_slot_1
    owners = [Collector() for _ in range(3)]
    for spec, owner in zip((specs[1], specs[5], specs[3]), owners, strict=True):  # A, B, no voice
        loop.submit(spec, owner)
    run_until_idle(loop)
    assert "copy failed" in str(owners[1].error)  # B's sequence, admitted second: slot 1
    for k, owner in ((1, owners[0]), (3, owners[2])):
        assert owner.error is None and torch.equal(owner.codes, alone(model, specs[k]).codes)
    assert loop.scheduler.free_slots == 3 and not loop.busy


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
    loop = scheduler_for(model, 2)
    keep, drop, waiting = Collector(), Collector(), Collector()
    loop.submit(specs[0], keep)
    loop.submit(specs[1], drop)
    loop.step()
    loop.submit(specs[2], waiting)
    loop.step()
    assert loop.scheduler.running == 2 and loop.scheduler.waiting == 1
    drop.cancelled = True
    loop.step()
    assert isinstance(drop.error, Cancelled)
    assert loop.scheduler.running + loop.scheduler.waiting == 2  # its slot is free at once
    for _ in range(ADMIT_GATHER_STEPS):  # the waiting sequence takes it once it waited for company
        for h in loop.step():
            h.owner.take(h.codes, h.first, h.final)
    assert loop.scheduler.running == 2 and loop.scheduler.waiting == 0
    run_until_idle(loop)
    assert torch.equal(keep.codes, alone(model, specs[0]).codes)
    assert torch.equal(waiting.codes, alone(model, specs[2]).codes)


def test_a_sequence_that_cannot_start_fails_alone(model, specs):
    loop = scheduler_for(model, 2)
    too_long = SequenceSpec(torch.zeros(11, CAPACITY + 5, dtype=torch.long), 0.8, 0.8, 1.0, 1, 10)
    bad, good = Collector(), Collector()
    loop.submit(too_long, bad)
    loop.submit(specs[3], good)
    run_until_idle(loop)
    assert isinstance(bad.error, ValueError) and "no room" in str(bad.error)
    assert good.finished and torch.equal(good.codes, alone(model, specs[3]).codes)


def test_a_sequence_whose_prefill_fails_in_a_batch_fails_alone(model, specs, monkeypatch):
    loop = scheduler_for(model, 2)
    runner = loop.runner.step_runner
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
    loop.submit(specs[3], bad)
    loop.submit(specs[1], good)
    run_until_idle(loop)
    assert batches == [2]
    assert isinstance(bad.error, RuntimeError) and not bad.blocks
    assert good.finished and good.error is None and torch.equal(good.codes, alone(model, specs[1]).codes)
    assert loop.scheduler.free_slots == 2 and not loop.busy


def test_a_sequence_whose_decode_state_cannot_start_in_a_batch_fails_alone(model, specs, monkeypatch):
    loop = scheduler_for(model, 2)
    state = loop.runner.state
    plain_start_many, batches = state.start_many, []

    def start_many(rows):  # the row of specs[3] cannot start
        batches.append(len(rows))
        if any(column.data_ptr() == specs[3].prompt[:, -1].data_ptr() for _, column, *_ in rows):
            raise RuntimeError("start failed")
        plain_start_many(rows)

    monkeypatch.setattr(state, "start_many", start_many)
    bad, good = Collector(), Collector()
    loop.submit(specs[3], bad)
    loop.submit(specs[1], good)
    run_until_idle(loop)
    assert batches == [2, 1, 1]
    assert isinstance(bad.error, RuntimeError) and not bad.blocks
    assert good.finished and good.error is None and torch.equal(good.codes, alone(model, specs[1]).codes)
    assert loop.scheduler.free_slots == 2 and not loop.busy
