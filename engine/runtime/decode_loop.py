"""One step of continuous batching: the scheduler plans on the CPU, the batch runner carries the
plan out on the device, the frame counts come back, and the frames that are due go out.

Every sequence's frames leave as `Harvest`s for the caller to decode; failures (cancelled
sequences, prompts that do not fit, a failed prefill) are told to their owners here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .batch_runner import BatchRunner
from .prefix_cache import PrefixCache
from .scheduler import Owner, SchedulePlan, Scheduler, SchedulerConfig, SequenceSpec, StepBatch
from .step_runner import StepRunner


@dataclass
class Harvest:
    owner: Any
    slot: int
    codes: Tensor  # (num_codebooks, n) on the device; valid until the next step
    first: bool  # the sequence's first frames: a new stream starts
    final: bool  # the sequence ended (here, or at <|im_end|>, which is not included)


class DecodeLoop:
    def __init__(self, scheduler: Scheduler, runner: BatchRunner):
        self.scheduler, self.runner = scheduler, runner

    @classmethod
    def over(cls, step_runner: StepRunner, prefix_cache: PrefixCache | None = None,
             config: SchedulerConfig = SchedulerConfig(), **scheduler_options) -> "DecodeLoop":
        """A scheduler for the step runner's slots and graphs, and a batch runner over them;
        scheduler_options: Scheduler's frame_rate and clock."""
        cache = step_runner.cache
        scheduler = Scheduler(cache.n_slots, cache.capacity, config, step_runner, **scheduler_options)
        return cls(scheduler, BatchRunner(step_runner, prefix_cache, config.read_back_lag))

    def submit(self, spec: SequenceSpec, owner: Owner, *, front: bool = False) -> None:
        self.scheduler.submit(spec, owner, front=front)

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    def step(self) -> list[Harvest]:
        """Schedule, admit, step the batch, read back the counts due, hand out the frames due."""
        plan = self.scheduler.schedule()
        batch = self._admit(plan)
        if batch is not None:
            self.runner.step(batch.rows, batch.kv_needed)
            if batch.read_back:
                self.scheduler.read_back_queued(self.runner.copy_counts())
        return self._hand_out()

    def _admit(self, plan: SchedulePlan) -> StepBatch | None:
        """Free the plan's slots, prefill and start its admissions; the batch that then runs."""
        try:
            self.runner.stop(plan.stopped)
            started, failed = self.runner.admit(plan.admitted)
        except Exception as exc:  # the plan's sequences have left the scheduler: they fail here
            _tell(plan.failed + [(a.owner, exc) for a in plan.admitted])
            raise
        _tell(plan.failed + failed)
        return self.scheduler.batch(started)

    def _hand_out(self) -> list[Harvest]:
        """Read the frame counts that are due and hand out the frames due, freeing finished slots."""
        harvests = []
        while (read := self.scheduler.next_read_back()) is not None:
            length, done = read.counts.wait()
            for out in self.scheduler.hand_out(read, length, done):
                harvests.append(Harvest(out.owner, out.slot, self.runner.frames(out.slot, out.start, out.end),
                                        out.first, out.final))
                if out.final:
                    self.runner.stop([out.slot])
        return harvests

    def fail_all(self, exc: BaseException) -> None:
        """After an error in a step: every running and waiting sequence fails with it."""
        stopped, failed = self.scheduler.fail_all(exc)
        self.runner.stop(stopped)
        _tell(failed)


def _tell(failures: list[tuple[Any, BaseException]]) -> None:
    for owner, exc in failures:
        owner.fail(exc)
