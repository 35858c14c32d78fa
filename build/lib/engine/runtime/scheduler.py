"""Continuous batching: sequences enter free KV slots, advance together one frame per step, and
leave as soon as they finish or their caller goes away.

One `iteration()` (on the GPU worker thread):
  1. drops cancelled sequences, running or waiting, freeing their slots at once;
  2. admits waiting sequences into free slots: their prompts are prefilled together in one batched
     call (the voice prefix copied from the prefix cache when it is there), and their rows of the
     decode state started; while others run, a new arrival waits a few steps for company
     (admit_gather_steps, ADMIT_GATHER_STEPS by default), so that arrivals one by one do not cost a
     prefill call each; at most as many sequences run as the runner has graphs for (`ready_slots`),
     and while more are asking than that and larger batch graphs are still to capture, none is
     admitted: the running ones finish, and the caller captures the graphs the demand needs
     (`needs_capture`); and while a stream in its first hand-outs (RAMP) has less than
     admit_min_lead_s (ADMIT_MIN_LEAD_S by default) of audio ahead of a listener who began at its
     first hand-out, new requests wait (up to ADMIT_MAX_DEFER_STEPS steps), since a prefill call
     and the newcomers' first codec calls hold up every running sequence;
  3. runs one batched decode step for every slot up to the highest one in use (a CUDA-graph
     replay for the batch and kv-length buckets; idle rows inside the bucket stand still);
  4. every so often reads back how many frames each slot has before `<|im_end|>`, and hands out
     the new frames of the sequences that are due (a sequence after 4 frames, for an early first
     audio, then 8 and 16, then every BLOCK frames; sequences admitted together stay together, so
     their audio decodes in one batched codec call), retiring those that finished.

The read-back lags `read_back_lag` steps (EngineConfig's default: 2): after a step that makes
sequences due, a copy of the counts is queued behind it, and it is read only once that many later
steps have been launched. The GPU so always has that many steps queued while the host waits and
hands out frames (a host held up by other threads, e.g. a web server's, for less than their time
leaves the GPU no gap); a finished sequence runs that many steps more than it needs, which nobody
sees.

Nothing here knows about audio or requests: a sequence's owner is any object with a `cancelled`
property and a `fail(exc)` method; frames come back as `Harvest`s for the caller to decode.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from loguru import logger
from torch import Tensor

from ..errors import Cancelled
from .generate import frame_budget
from .prefix_cache import PrefixCache
from .step_runner import StepRunner

# Frames per hand-out: a short first block for an early first audio, growing ones that each arrive
# before a listener has played the audio before them (at up to ~2x real time), then BLOCK at a time
# (fewer, larger codec calls: each is a graph of ~1,500 kernels).
RAMP = (4, 8, 16)
BLOCK = 32
BLOCK_SIZES = (*RAMP, BLOCK)  # every non-final hand-out has one of these lengths
RAMP_MARKS = tuple(itertools.accumulate(RAMP))  # the steps at which the ramp's hand-outs are due
RAMP_END = RAMP_MARKS[-1]
# Frame counts are also read every this many steps, whoever is due: past its ramp a stream hands
# out every BLOCK steps, and one that sampled its end in between is found this soon (plus the
# read-back lag), its slot freed and its last audio handed out.
END_CHECK_STEPS = 4
# A prefix shorter than this is cheaper to prefill than to look up and copy.
MIN_PREFIX = 16
# While sequences run, a new arrival waits up to this many steps for others to arrive and be
# admitted with it: a prefill call costs ~15-25 ms of host time however many rows it has (H100),
# and requests arriving one by one would otherwise stall every running sequence once each.
ADMIT_GATHER_STEPS = 4
# Admission holds up running sequences (64 streams over HTTP on an H100: 8 frames took 0.21-0.35 s
# while later arrivals were admitted, and listeners who had only the first 4 frames, 0.19 s, ran
# dry: docs/PERFORMANCE.md). So while a stream in its ramp has less audio than this ahead of its
# listener, new requests wait, for at most ADMIT_MAX_DEFER_STEPS steps in a row (a stream slower
# than real time must not keep them out for good). The lead counts frames as they leave for the
# codec, from the first hand-out: the codec's delay shifts both ends alike.
ADMIT_MIN_LEAD_S = 0.25
ADMIT_MAX_DEFER_STEPS = 16


class Owner(Protocol):
    @property
    def cancelled(self) -> bool: ...

    def fail(self, exc: BaseException) -> None: ...


@dataclass
class SequenceSpec:
    prompt: Tensor  # (1 + num_codebooks, L) integer, on the runner's device
    temperature: float
    top_p: float
    repetition_penalty: float
    noise_key: int
    max_new_tokens: int  # 0 = up to the context limit
    prefix_key: str | None = None  # names prompt[:, :prefix_length], the voice prefix
    prefix_length: int = 0
    stop_at_end: bool = True  # False: run the whole budget whatever is sampled (benchmarks)


@dataclass
class Harvest:
    owner: Any
    slot: int
    codes: Tensor  # (num_codebooks, n) on the device; valid until the next iteration
    first: bool  # the sequence's first frames: a new stream starts
    final: bool  # the sequence ended (here, or at <|im_end|>, which is not included)


@dataclass
class _Snapshot:
    """Per-slot frame counts and end flags copied to the host after one step, and who was due then."""

    host: Tensor  # (2, S) int64: frames before <|im_end|>, and done
    ready: Any  # a CUDA event recorded after the copy, or None when the copy was synchronous
    steps: dict[int, tuple["_Running", int, bool]]  # slot -> (sequence, its steps then, due then)
    step: int  # the scheduler's step count when it was taken

    def wait(self) -> tuple[list[int], list[int]]:
        if self.ready is not None:
            self.ready.synchronize()
        length, done = self.host.tolist()
        return length, done


@dataclass
class _Running:
    spec: SequenceSpec
    owner: Any
    slot: int
    prompt_len: int
    budget: int
    steps: int = 0  # frames generated so far
    emitted: int = 0  # frames handed out
    harvested: bool = False
    text_start: int = 0  # the first prompt column prefilled at admission (after a voice prefix served by the cache)
    first_out: float | None = None  # the clock when its first frames were handed out
    continues: bool = False  # a request's next text chunk: its listener still has the chunk before's audio


class Scheduler:
    def __init__(self, runner: StepRunner, prefix_cache: PrefixCache | None = None, max_admit_per_step: int = 16,
                 frame_rate: float | None = None, clock=time.monotonic, read_back_lag: int = 1,
                 admit_gather_steps: int = ADMIT_GATHER_STEPS, admit_min_lead_s: float = ADMIT_MIN_LEAD_S):
        """frame_rate: frames per second of audio, for the listeners' lead (see ADMIT_MIN_LEAD_S); None
        admits without looking at it. clock: seconds, monotonic. read_back_lag: steps launched after
        a step before its frame counts are read (see the module's docstring); at least 1.
        admit_gather_steps, admit_min_lead_s: see ADMIT_GATHER_STEPS and ADMIT_MIN_LEAD_S (0 turns
        each off)."""
        if read_back_lag < 1:
            raise ValueError(f"read_back_lag must be at least 1, got {read_back_lag}")
        if admit_gather_steps < 0 or admit_min_lead_s < 0:
            raise ValueError(f"admit_gather_steps and admit_min_lead_s must be >= 0, got {admit_gather_steps}"
                             f" and {admit_min_lead_s}")
        self.admit_gather_steps, self.admit_min_lead_s = admit_gather_steps, admit_min_lead_s
        self.runner = runner
        self.frame_rate, self.clock = frame_rate, clock
        self.prefix_cache = prefix_cache
        self.max_admit_per_step = max_admit_per_step
        self.n_slots = runner.cache.n_slots
        self._waiting: deque[tuple[SequenceSpec, Any, bool]] = deque()  # (spec, owner, front)
        self._running: dict[int, _Running] = {}  # by slot
        self.read_back_lag = read_back_lag
        self._snapshots: deque[_Snapshot] = deque()  # taken, not yet read; oldest first
        device = runner.state.length.device
        pinned = device.type == "cuda"
        # One buffer more than the snapshots left unread after an iteration: a step's snapshot is
        # written while those are still to be read.
        self._host = [torch.zeros(2, self.n_slots, dtype=torch.int64, pin_memory=pinned)
                      for _ in range(read_back_lag + 1)]
        self._next_host = 0
        self._steps = 0  # batched steps run so far
        self._admit_at = 0  # the step from which the waiting sequences are admitted (see ADMIT_GATHER_STEPS)
        self._deferred = 0  # steps in a row admission has waited for listeners' lead (see ADMIT_MIN_LEAD_S)

    # ---- queue --------------------------------------------------------------------------------

    def submit(self, spec: SequenceSpec, owner: Owner, *, front: bool = False) -> None:
        """Queue a sequence; front=True for the next text chunk of a request already running (it is
        admitted without waiting for others or for other listeners' lead: its own listener is
        waiting)."""
        if front:
            self._admit_at = self._steps
        elif not self._waiting:
            self._admit_at = self._steps + self.admit_gather_steps
        (self._waiting.appendleft if front else self._waiting.append)((spec, owner, front))

    @property
    def busy(self) -> bool:
        # A snapshot not yet read still holds its sequences' owners: one more iteration drops it.
        return bool(self._waiting or self._running or self._snapshots)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def free_slots(self) -> int:
        return self.n_slots - len(self._running)

    @property
    def drained(self) -> bool:
        """No sequence running and no step's read-back outstanding: graphs may be captured."""
        return not self._running and not self._snapshots

    @property
    def demand(self) -> int:
        """Sequences running or waiting, up to the number of slots."""
        return min(len(self._running) + len(self._waiting), self.n_slots)

    @property
    def needs_capture(self) -> bool:
        """More sequences ask to run than the runner's graphs can step, and it can capture more."""
        return self.demand > self.runner.ready_slots and bool(self.runner.pending_batches)

    # ---- one iteration ------------------------------------------------------------------------

    def iteration(self) -> list[Harvest]:
        self._drop_cancelled()
        self._admit()
        if self._running:
            self._step()
        harvests = []
        # Once nothing runs, no later step will come: the snapshots left are read at once.
        while self._snapshots and (self._snapshots[0].step <= self._steps - self.read_back_lag or not self._running):
            harvests += self._harvest(self._snapshots.popleft())
        return harvests

    def fail_all(self, exc: BaseException) -> None:
        """After an error in a batched step: every running and waiting sequence fails with it."""
        for seq in list(self._running.values()):
            self._retire(seq)
            seq.owner.fail(exc)
        while self._waiting:
            self._waiting.popleft()[1].fail(exc)
        self._snapshots.clear()  # their sequences have failed: nothing left to hand out
        self._deferred = 0

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._running.values() if s.owner.cancelled]:
            self._retire(seq)
            seq.owner.fail(Cancelled())
        if any(owner.cancelled for _, owner, _ in self._waiting):
            keep = deque()
            for entry in self._waiting:
                if entry[1].cancelled:
                    entry[1].fail(Cancelled())
                else:
                    keep.append(entry)
            self._waiting = keep

    def _admit(self) -> None:
        if self.needs_capture:
            return  # drain: the caller captures larger batch graphs once nothing runs
        if self._running and self._steps < self._admit_at and len(self._waiting) < self.max_admit_per_step:
            return  # gather arrivals for one prefill call (see ADMIT_GATHER_STEPS)
        # At least one row: without any graph, the step itself reports what is missing.
        limit = min(self.n_slots, max(self.runner.ready_slots, 1))
        if not self._waiting or len(self._running) >= limit:
            self._deferred = 0
            return
        front_waiting = self._waiting[0][2]  # front entries head the queue
        if not front_waiting and self._deferred < ADMIT_MAX_DEFER_STEPS and self._a_listener_is_short():
            self._deferred += 1
            return
        self._deferred = 0
        free = sorted(set(range(self.n_slots)) - self._running.keys())
        admitted: list[_Running] = []
        stored: dict[int, tuple[Tensor, Tensor]] = {}  # by slot: the cached voice prefixes to place
        # The steps run past a sequence's end before its read-back (read_back_lag - 1 of them beyond
        # the one the cache's last position takes) must find room too.
        room = self.runner.cache.capacity - (self.read_back_lag - 1)
        while self._waiting and len(self._running) + len(admitted) < limit and len(admitted) < self.max_admit_per_step:
            spec, owner, front = self._waiting.popleft()
            seq = _Running(spec, owner, free[len(admitted)], spec.prompt.shape[1], 0, continues=front)
            try:
                seq.budget = frame_budget(spec.prompt.shape[1], spec.max_new_tokens, room)
                seq.text_start, prefix = self._voice_prefix(seq.slot, spec)
            except Exception as exc:  # this sequence's fault (or its prefill's): it alone fails
                owner.fail(exc)
                continue
            admitted.append(seq)
            if prefix is not None:
                stored[seq.slot] = prefix
        self._start(self._prefill_texts(self._place_prefixes(admitted, stored)))

    def _start(self, prefilled: list[_Running]) -> None:
        """Start the prefilled sequences' rows of the decode state, together (each alone if that fails)."""
        def start(seqs: list[_Running]) -> None:
            self.runner.state.start_many([(seq.slot, seq.spec.prompt[:, -1], seq.spec.prompt.shape[1] - 1,
                                           seq.spec.temperature, seq.spec.top_p, seq.spec.repetition_penalty,
                                           seq.spec.noise_key) for seq in seqs])

        for seq in self._together_or_alone(prefilled, start, "starting decode rows"):
            self._running[seq.slot] = seq

    def _together_or_alone(self, seqs: list[_Running], call, what: str) -> list[_Running]:
        """call(seqs) once; if it raises, call([seq]) for each (a lone sequence is not tried twice),
        so that only a sequence whose own call fails fails. Returns the sequences that went through."""
        if not seqs:
            return []
        try:
            call(seqs)
            return seqs
        except Exception as exc:
            if len(seqs) == 1:
                seqs[0].owner.fail(exc)
                return []
            logger.warning("{} for {} sequences together failed ({}): one at a time", what, len(seqs), exc)
        went_through = []
        for seq in seqs:
            try:
                call([seq])
                went_through.append(seq)
            except Exception as exc:
                seq.owner.fail(exc)
        return went_through

    def _a_listener_is_short(self) -> bool:
        """Whether a stream in its ramp (handed out, not a request's next chunk) has less than
        admit_min_lead_s of audio ahead of its listener."""
        if self.frame_rate is None or not self.admit_min_lead_s:
            return False
        now = self.clock()
        return any(seq.emitted / self.frame_rate - (now - seq.first_out) < self.admit_min_lead_s
                   for seq in self._running.values()
                   if seq.first_out is not None and not seq.continues and seq.emitted < RAMP_END)

    def _voice_prefix(self, slot: int, spec: SequenceSpec) -> tuple[int, tuple[Tensor, Tensor] | None]:
        """The first prompt column still to prefill, and the stored voice prefix to place in the
        slot (None when there is none to place). A prefix the cache does not hold is prefilled in
        the slot and stored at once, so that a later sequence of the same burst finds it."""
        prefix = spec.prefix_length
        usable = (self.prefix_cache is not None and spec.prefix_key is not None
                  and MIN_PREFIX <= prefix < spec.prompt.shape[1])
        if not usable:
            return 0, None
        # The prefix is always prefilled on its own, hit or miss, so a sequence's KV (and so its
        # frames) does not depend on whether its voice was cached.
        cached = self.prefix_cache.get(spec.prefix_key, prefix)
        if cached is None:
            self.runner.prefill(slot, spec.prompt, 0, prefix)
            self.prefix_cache.store(spec.prefix_key, slot, prefix)
        return prefix, cached

    def _place_prefixes(self, admitted: list[_Running], stored: dict[int, tuple[Tensor, Tensor]]) -> list[_Running]:
        """Copy the stored voice prefixes (by slot) into their slots, in one call; returns the
        sequences that can go on."""
        def place(seqs: list[_Running]) -> None:
            self.prefix_cache.place([(stored[seq.slot], seq.slot) for seq in seqs])

        placed = {seq.slot for seq in self._together_or_alone([seq for seq in admitted if seq.slot in stored], place,
                                                                "placing voice prefixes")}
        return [seq for seq in admitted if seq.slot not in stored or seq.slot in placed]

    def _prefill_texts(self, admitted: list[_Running]) -> list[_Running]:
        """Prefill the rest of every admitted prompt, together; returns the sequences that can run."""
        def prefill(seqs: list[_Running]) -> None:
            self.runner.prefill_many([(seq.slot, seq.spec.prompt, seq.text_start) for seq in seqs])

        return self._together_or_alone(admitted, prefill, "prefilling texts")

    def _step(self) -> None:
        batch = max(self._running) + 1
        kv_needed = max(s.prompt_len + s.steps for s in self._running.values())
        self.runner.step(batch, kv_needed)
        self._steps += 1
        for seq in self._running.values():
            seq.steps += 1
        due = {slot: self._due(seq) for slot, seq in self._running.items()}
        if any(due.values()) or self._steps % END_CHECK_STEPS == 0:
            self._snapshots.append(self._take_snapshot(due))

    @staticmethod
    def _due(seq: _Running) -> bool:
        # Fixed block lengths per sequence (BLOCK_SIZES): the codec replays a graph per length.
        steps = seq.steps
        if steps >= seq.budget or steps in RAMP_MARKS:
            return True
        return steps > RAMP_END and (steps - RAMP_END) % BLOCK == 0

    def _take_snapshot(self, due: dict[int, bool]) -> _Snapshot:
        state = self.runner.state
        host = self._host[self._next_host]
        self._next_host = (self._next_host + 1) % len(self._host)
        host[0].copy_(state.length, non_blocking=True)
        host[1].copy_(state.done, non_blocking=True)
        ready = None
        if host.is_pinned():
            ready = torch.cuda.Event()
            ready.record()
        steps = {slot: (seq, seq.steps, due[slot]) for slot, seq in self._running.items()}
        return _Snapshot(host, ready, steps, self._steps)

    def _harvest(self, snapshot: _Snapshot) -> list[Harvest]:
        """Frames of the sequences due at the snapshot's step (or found ended there)."""
        length, done = snapshot.wait()
        frames = self.runner.state.frames
        harvests = []
        for slot, (seq, steps, due) in snapshot.steps.items():
            if self._running.get(slot) is not seq:
                continue  # cancelled since
            ended = bool(done[slot]) and seq.spec.stop_at_end
            if not (ended or due):
                continue
            valid = length[slot] if ended else steps
            final = ended or steps >= seq.budget
            codes = frames[slot, 1:, seq.emitted:valid]
            harvests.append(Harvest(seq.owner, slot, codes, first=not seq.harvested, final=final))
            if not seq.harvested:
                seq.first_out = self.clock()
            seq.emitted, seq.harvested = valid, True
            if final:
                self._retire(seq)
        return harvests

    def _retire(self, seq: _Running) -> None:
        self.runner.state.stop(seq.slot)
        del self._running[seq.slot]
