"""The one thread that owns the GPU, and the jobs that travel to it and stream results back.

CUDA graphs, compiled callables and grad mode are thread-local, so every tensor operation of the
engine runs on this thread. Callers submit a job and iterate its results from their own thread.
The thread alternates between the jobs that have arrived (each one's `work` runs at once: set-up
calls run to completion, requests hand their sequences to the scheduler) and one `step()` of the
engine: after each round of jobs, and whenever no job waits while the loop has work.
With nothing to do for IDLE_AFTER_S, it runs the background work given to `when_idle` (capturing
larger batch graphs), one unit between checks of its queue, until none is left. A job ends when `finish()` is called on it, by its work
or later by whoever carries it on; a failing job reports its exception to its caller and the
worker carries on.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

from loguru import logger

from ..errors import Cancelled, InputError, QueueFullError

_DONE = object()
IDLE_AFTER_S = 1.0  # quiet time before background work starts: a request that follows another does not wait for it


class Job:
    def __init__(self, work: Callable[["Job"], None], on_finish: Callable[[], None] = lambda: None):
        self.work = work
        self._outputs: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()
        self._finished = False
        self._on_finish = on_finish
        self.marks: dict[str, float] = {}  # when the job reached each named stage (perf_counter), first time only

    # ---- worker side
    def mark(self, stage: str) -> None:
        self.marks.setdefault(stage, time.perf_counter())

    def emit(self, item: Any) -> None:
        self._outputs.put(item)

    def finish(self, exc: BaseException | None = None) -> None:
        """End the job (once; later calls do nothing), passing `exc` to the caller if given."""
        if self._finished:
            return
        self._finished = True
        if exc is not None and not isinstance(exc, Cancelled):
            self._outputs.put(exc)
        self._outputs.put(_DONE)
        self._on_finish()

    @property
    def finished(self) -> bool:
        return self._finished

    # ---- caller side
    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def results(self) -> Iterator[Any]:
        """Items as the worker emits them; re-raises the job's exception in the caller's thread."""
        try:
            while True:
                item = self._outputs.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()  # a caller that stops early frees its slot at the next step


class GPUWorker:
    """capacity: jobs accepted at once (running or waiting); beyond it submit() raises QueueFullError.
    step: one engine step; returns whether it still has work.
    on_start: runs first on the worker thread (thread-local set-up, such as its CUDA stream); if it
    fails, the failure is logged and the worker runs without it."""

    def __init__(self, capacity: int, step: Callable[[], bool] = lambda: False, name: str = "s1-gpu-worker",
                 on_start: Callable[[], None] = lambda: None):
        self.capacity = capacity
        self._step = step
        self._on_start = on_start
        self._idle: Callable[[], bool] | None = None
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._in_flight = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[Job], None]) -> Job:
        with self._lock:
            if self._in_flight >= self.capacity:
                raise QueueFullError(f"the engine is busy ({self._in_flight} requests in progress); retry shortly",
                                     retry_after_s=2.0)
            self._in_flight += 1
        job = Job(work, on_finish=self._release)
        self._queue.put(job)
        return job

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the worker thread and return its result (for set-up work such as warm-up)."""

        def work(job: Job) -> None:
            job.emit(fn())
            job.finish()

        return self.first_result(work)

    def first_result(self, work: Callable[[Job], None]) -> Any:
        """Submit `work` and wait for the first item it emits, at once or from a later engine step."""
        return next(iter(self.submit(work).results()))

    def when_idle(self, work: Callable[[], bool]) -> None:
        """Call from a job on this worker: run `work` (one unit per call, returning whether more
        remains) whenever the worker has nothing else to do, until it returns False."""
        self._idle = work

    @property
    def in_flight(self) -> int:
        """Jobs accepted and not finished: requests running or waiting for a slot."""
        return self._in_flight

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _loop(self) -> None:
        try:
            self._on_start()
        except Exception:
            logger.exception("the GPU worker's set-up failed; it runs without it")
        busy, quiet = False, False
        while True:
            # Busy: poll between steps. Idle work left: wait IDLE_AFTER_S for a job the first
            # time, then poll between its units. Otherwise: sleep until a job arrives.
            idle = self._idle is not None and not busy
            timeout = (0 if quiet else IDLE_AFTER_S) if idle else None
            try:
                job = self._queue.get(block=not busy, timeout=timeout)
            except queue.Empty:
                if busy:
                    busy = self._guarded(self._step, "engine step")
                else:
                    quiet = True
                    if not self._guarded(self._idle, "background work"):
                        self._idle = None
                continue
            if not self._run_round(job):
                return
            job = None  # hold no finished job (its unread output) while the loop waits
            busy = self._guarded(self._step, "engine step")  # the jobs may have handed it work
            quiet = False

    def _run_round(self, job: Job | None) -> bool:
        """Run `job` and the jobs waiting behind it now, no later arrivals: jobs arriving one after
        another (a burst of requests being parsed) must not hold up the decode loop's running
        sequences, nor the admission of the requests that arrived first. False once closed."""
        behind = self._queue.qsize()
        for i in range(1 + behind):
            job = job if i == 0 else self._queue.get_nowait()
            if job is None:
                return False
            self._run(job)
        return True

    def _run(self, job: Job) -> None:
        if job.cancelled:
            job.finish()
            return
        try:
            job.work(job)
        except Exception as exc:  # reported to that caller; the worker serves the next job
            if not isinstance(exc, (InputError, Cancelled)):
                logger.exception("request failed on the GPU worker")
            job.finish(exc)

    @staticmethod
    def _guarded(fn: Callable[[], bool], what: str) -> bool:
        try:
            return fn()
        except Exception:  # the loop's own error handling failed: keep the thread alive
            logger.exception("{} failed", what)
            return False
