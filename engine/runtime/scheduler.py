"""Continuous batching policy: which sequences run, in which slots, and when their frames go out.

The scheduler is plain CPU bookkeeping: it never touches a tensor's data or launches device work.
Each engine step asks it, in order (see DecodeLoop.step, which carries the plans out):
  1. `schedule()`: drop cancelled sequences, running or waiting (their slots to free), and pick
     the waiting sequences to admit into free slots; while others run, a new arrival waits a few
     steps for company (admit_gather_steps), so that arrivals one by one do not cost a prefill call
     each; at most as many sequences run as there are captured graphs for (`graphs.ready_slots`),
     and while more are asking than that and larger batch graphs are still to capture, none is
     admitted: the running ones finish, and the caller captures the graphs the demand needs
     (`needs_capture`); and while a stream in its first hand-outs (RAMP) has less than
     admit_min_lead_s of audio ahead of a listener who began at its first hand-out, new requests
     wait (up to ADMIT_MAX_DEFER_STEPS steps), since a prefill call and the newcomers' first codec
     calls hold up every running sequence;
  2. `batch(started)`: after the admitted sequences were prefilled, the rows to step (every slot up
     to the highest one in use; idle rows inside the batch bucket stand still) and whether the
     frame counts are read back after this step;
  3. `next_read_back()` / `hand_out()`: the frame counts due to be read, then the frames of the
     sequences that are due (a sequence after 4 frames, for an early first audio, then 8 and 16,
     then every BLOCK frames; sequences admitted together stay together, so that their audio
     decodes in one batched codec call), retiring those that finished.

The read-back lags `read_back_lag` steps: after a step that makes sequences due, a copy of the
counts is queued behind it, and it is read only once that many later steps have been launched. The
GPU so always has that many steps queued while the host waits and hands out frames (a host held up
by other threads, e.g. a web server's, for less than their time leaves the GPU no gap); a finished
sequence runs that many steps more than it needs, which nobody sees.

Nothing here knows about audio or requests: a sequence's owner is any object with a `cancelled`
property and a `fail(exc)` method, which the caller calls with the failures a plan names.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import Cancelled, InputError

if TYPE_CHECKING:
    from torch import Tensor

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
# While sequences run, a new arrival waits up to this many steps for others to arrive and be
# admitted with it: a prefill call costs tens of milliseconds of host time however many rows it
# has, and requests arriving one by one would otherwise stall every running sequence once each.
ADMIT_GATHER_STEPS = 4
# Admission holds up running sequences, and a listener who has only the first hand-out runs dry
# meanwhile. So while a stream in its ramp has less audio than this ahead of its listener, new
# requests wait, for at most ADMIT_MAX_DEFER_STEPS steps in a row (a stream slower than real time
# must not keep them out for good). The lead counts frames as they leave for the codec, from the
# first hand-out: the codec's delay shifts both ends alike.
ADMIT_MIN_LEAD_S = 0.25
ADMIT_MAX_DEFER_STEPS = 16
# Steps launched after a step before its frame counts are read (see the module's docstring).
READ_BACK_LAG = 2
MAX_ADMIT_PER_STEP = 16


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's settings (EngineConfig carries the first three), validated here, once.
    0 turns admit_gather_steps or admit_min_lead_s off."""

    read_back_lag: int = READ_BACK_LAG
    admit_gather_steps: int = ADMIT_GATHER_STEPS
    admit_min_lead_s: float = ADMIT_MIN_LEAD_S
    max_admit_per_step: int = MAX_ADMIT_PER_STEP

    def __post_init__(self):
        if self.read_back_lag < 1:
            raise InputError(f"read_back_lag must be at least 1, got {self.read_back_lag}")
        if self.admit_gather_steps < 0 or self.admit_min_lead_s < 0:
            raise InputError(f"admit_gather_steps and admit_min_lead_s must be >= 0 (0 = off), got "
                             f"{self.admit_gather_steps} and {self.admit_min_lead_s}")
        if self.max_admit_per_step < 1:
            raise InputError(f"max_admit_per_step must be at least 1, got {self.max_admit_per_step}")


class Owner(Protocol):
    @property
    def cancelled(self) -> bool: ...

    def fail(self, exc: BaseException) -> None: ...


class CaptureState(Protocol):
    """What the scheduler needs to know of the step graphs (StepRunner has both)."""

    ready_slots: int  # rows that can step together now

    @property
    def pending_batches(self) -> list[int]: ...  # batch buckets still to capture


@dataclass
class AllGraphs:
    """Every row can step: eager execution, or every graph captured."""

    ready_slots: int
    pending_batches: list[int] = field(default_factory=list)


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

    @property
    def prompt_length(self) -> int:
        return self.prompt.shape[1]


@dataclass
class Admission:
    """A sequence to prefill into `slot` and start there."""

    slot: int
    spec: SequenceSpec
    owner: Any
    budget: int  # frames to generate at most
    continues: bool  # a request's next text chunk (see _Running.continues)


@dataclass
class SchedulePlan:
    """What to do before the step, in this order: free `stopped` slots, admit `admitted`; and tell
    `failed` owners (cancelled, or a prompt that does not fit) of their failure."""

    stopped: list[int]
    admitted: list[Admission]
    failed: list[tuple[Any, BaseException]]


@dataclass
class StepBatch:
    rows: int  # slots 0..rows-1 step
    kv_needed: int  # the highest position written this step + 1
    read_back: bool  # queue a copy of the frame counts behind the step (see DecodeLoop.step)


@dataclass
class HandOut:
    """Frames start..end-1 of the sequence in `slot`."""

    owner: Any
    slot: int
    start: int
    end: int
    first: bool  # the sequence's first frames: a new stream starts
    final: bool  # the sequence ended (here, or at <|im_end|>, which is not included)


@dataclass
class ReadBack:
    """Frame counts copied after one step (`counts`, the runner's handle) and who was due then."""

    counts: Any
    steps: dict[int, tuple["_Running", int, bool]]  # slot -> (sequence, its steps then, due then)
    step: int  # the scheduler's step count when it was taken


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
    first_out: float | None = None  # the clock when its first frames were handed out
    continues: bool = False  # a request's next text chunk: its listener still has the chunk before's audio


def frame_budget(prompt_len: int, max_new_tokens: int, capacity: int) -> int:
    """Frames to generate at most: max_new_tokens (0 = no limit), clamped to the free context."""
    room = capacity - prompt_len
    if room < 1:
        raise ValueError(f"prompt of {prompt_len} positions leaves no room in a context of {capacity}")
    return room if max_new_tokens <= 0 else min(max_new_tokens, room)


class Scheduler:
    def __init__(self, n_slots: int, capacity: int, config: SchedulerConfig = SchedulerConfig(),
                 graphs: CaptureState | None = None, *, frame_rate: float | None = None, clock=time.monotonic):
        """n_slots: KV slots; capacity: positions per slot; graphs: which batches can step (default:
        all). frame_rate: frames per second of audio, for the listeners' lead (see
        ADMIT_MIN_LEAD_S); None admits without looking at it. clock: seconds, monotonic."""
        self.n_slots, self.capacity, self.config = n_slots, capacity, config
        self.graphs = graphs if graphs is not None else AllGraphs(n_slots)
        self.frame_rate, self.clock = frame_rate, clock
        self._waiting: deque[tuple[SequenceSpec, Any, bool]] = deque()  # (spec, owner, front)
        self._running: dict[int, _Running] = {}  # by slot
        self._read_backs: deque[ReadBack] = deque()  # taken, not yet read; oldest first
        self._steps = 0  # batched steps run so far
        self._admit_at = 0  # the step from which the waiting sequences are admitted (see ADMIT_GATHER_STEPS)
        self._deferred = 0  # steps in a row admission has waited for listeners' lead (see ADMIT_MIN_LEAD_S)
        self._due: dict[int, bool] = {}  # by slot: whether the sequence hands out after the last step

    # ---- queue --------------------------------------------------------------------------------

    def submit(self, spec: SequenceSpec, owner: Owner, *, front: bool = False) -> None:
        """Queue a sequence; front=True for the next text chunk of a request already running (it is
        admitted without waiting for others or for other listeners' lead: its own listener is
        waiting)."""
        if front:
            self._admit_at = self._steps
        elif not self._waiting:
            self._admit_at = self._steps + self.config.admit_gather_steps
        (self._waiting.appendleft if front else self._waiting.append)((spec, owner, front))

    @property
    def busy(self) -> bool:
        # A read-back not yet done still holds its sequences' owners: one more step drops it.
        return bool(self._waiting or self._running or self._read_backs)

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
        return not self._running and not self._read_backs

    @property
    def demand(self) -> int:
        """Sequences running or waiting, up to the number of slots."""
        return min(len(self._running) + len(self._waiting), self.n_slots)

    @property
    def needs_capture(self) -> bool:
        """More sequences ask to run than the captured graphs can step, and more can be captured."""
        return self.demand > self.graphs.ready_slots and bool(self.graphs.pending_batches)

    # ---- one step -----------------------------------------------------------------------------

    def schedule(self) -> SchedulePlan:
        """Drop the cancelled sequences and pick the ones to admit."""
        plan = SchedulePlan([], [], [])
        self._drop_cancelled(plan)
        self._admit(plan)
        return plan

    def batch(self, started: list[Admission]) -> StepBatch | None:
        """The `started` admissions run from now on; the batch to step, None when nothing runs."""
        for a in started:
            self._running[a.slot] = _Running(a.spec, a.owner, a.slot, a.spec.prompt_length, a.budget,
                                             continues=a.continues)
        if not self._running:
            return None
        rows = max(self._running) + 1
        kv_needed = max(s.prompt_len + s.steps for s in self._running.values())
        self._steps += 1
        for seq in self._running.values():
            seq.steps += 1
        self._due = {slot: _is_due(seq) for slot, seq in self._running.items()}
        return StepBatch(rows, kv_needed, any(self._due.values()) or self._steps % END_CHECK_STEPS == 0)

    def read_back_queued(self, counts: Any) -> None:
        """The step's frame counts are being copied (`counts`: the runner's handle for them)."""
        steps = {slot: (seq, seq.steps, self._due[slot]) for slot, seq in self._running.items()}
        self._read_backs.append(ReadBack(counts, steps, self._steps))

    def next_read_back(self) -> ReadBack | None:
        """The oldest read-back due now: `read_back_lag` steps behind, or at once when nothing runs
        (no later step will come)."""
        if self._read_backs and (self._read_backs[0].step <= self._steps - self.config.read_back_lag or not self._running):
            return self._read_backs.popleft()
        return None

    def hand_out(self, read: ReadBack, length: list[int], done: list[int]) -> list[HandOut]:
        """The frames of the sequences due at the read-back's step (or found ended there), given
        each slot's frames before <|im_end|> (`length`) and end flag (`done`); retires the finished
        ones (their slots: the hand-outs marked final)."""
        hand_outs = []
        for slot, (seq, steps, due) in read.steps.items():
            if self._running.get(slot) is not seq:
                continue  # cancelled since
            ended = bool(done[slot]) and seq.spec.stop_at_end
            if not (ended or due):
                continue
            valid = length[slot] if ended else steps
            final = ended or steps >= seq.budget
            hand_outs.append(HandOut(seq.owner, slot, seq.emitted, valid, first=not seq.harvested, final=final))
            if not seq.harvested:
                seq.first_out = self.clock()
            seq.emitted, seq.harvested = valid, True
            if final:
                del self._running[slot]
        return hand_outs

    def fail_all(self, exc: BaseException) -> tuple[list[int], list[tuple[Any, BaseException]]]:
        """After an error in a batched step: every running and waiting sequence fails with it.
        Returns the slots to free and the failures to tell."""
        stopped = list(self._running)
        failed = [(seq.owner, exc) for seq in self._running.values()]
        self._running.clear()
        failed += [(owner, exc) for _, owner, _ in self._waiting]
        self._waiting.clear()
        self._read_backs.clear()  # their sequences have failed: nothing left to hand out
        self._deferred = 0
        return stopped, failed

    # ---- policy -------------------------------------------------------------------------------

    @property
    def _room(self) -> int:
        # The steps run past a sequence's end before its read-back (read_back_lag - 1 of them beyond
        # the one the cache's last position takes) must find room too.
        return self.capacity - (self.config.read_back_lag - 1)

    def _drop_cancelled(self, plan: SchedulePlan) -> None:
        for seq in [s for s in self._running.values() if s.owner.cancelled]:
            del self._running[seq.slot]
            plan.stopped.append(seq.slot)
            plan.failed.append((seq.owner, Cancelled()))
        if any(owner.cancelled for _, owner, _ in self._waiting):
            keep = deque()
            for entry in self._waiting:
                if entry[1].cancelled:
                    plan.failed.append((entry[1], Cancelled()))
                else:
                    keep.append(entry)
            self._waiting = keep

    def _admit(self, plan: SchedulePlan) -> None:
        if self.needs_capture:
            return  # drain: the caller captures larger batch graphs once nothing runs
        if self._running and self._steps < self._admit_at and len(self._waiting) < self.config.max_admit_per_step:
            return  # gather arrivals for one prefill call (see ADMIT_GATHER_STEPS)
        # At least one row: without any graph, the step itself reports what is missing.
        limit = min(self.n_slots, max(self.graphs.ready_slots, 1))
        if not self._waiting or len(self._running) >= limit:
            self._deferred = 0
            return
        front_waiting = self._waiting[0][2]  # front entries head the queue
        if not front_waiting and self._deferred < ADMIT_MAX_DEFER_STEPS and self._a_listener_is_short():
            self._deferred += 1
            return
        self._deferred = 0
        free = sorted(set(range(self.n_slots)) - self._running.keys())
        admitted = plan.admitted
        while self._waiting and len(self._running) + len(admitted) < limit and len(admitted) < self.config.max_admit_per_step:
            spec, owner, front = self._waiting.popleft()
            try:
                budget = frame_budget(spec.prompt_length, spec.max_new_tokens, self._room)
            except ValueError as exc:  # this sequence's fault: it alone fails
                plan.failed.append((owner, exc))
                continue
            admitted.append(Admission(free[len(admitted)], spec, owner, budget, continues=front))

    def _a_listener_is_short(self) -> bool:
        """Whether a stream in its ramp (handed out, not a request's next chunk) has less than
        admit_min_lead_s of audio ahead of its listener."""
        lead = self.config.admit_min_lead_s
        if self.frame_rate is None or not lead:
            return False
        now = self.clock()
        return any(seq.emitted / self.frame_rate - (now - seq.first_out) < lead
                   for seq in self._running.values()
                   if seq.first_out is not None and not seq.continues and seq.emitted < RAMP_END)


def _is_due(seq: _Running) -> bool:
    # Fixed block lengths per sequence (BLOCK_SIZES): the codec replays a graph per length.
    steps = seq.steps
    if steps >= seq.budget or steps in RAMP_MARKS:
        return True
    return steps > RAMP_END and (steps - RAMP_END) % BLOCK == 0
