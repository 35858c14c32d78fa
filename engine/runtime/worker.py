"""The one thread that owns the GPU, and the jobs that travel to it and stream results back.

CUDA graphs, compiled callables and grad mode are thread-local, so every tensor operation of the
engine runs on this thread. Callers submit a job and iterate its results from their own thread;
a failing job reports its exception to its caller and the worker carries on.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

from loguru import logger

from ..errors import QueueFullError

_DONE = object()


class Cancelled(Exception):
    """Raised inside a job's work when its caller has gone away."""


class Job:
    def __init__(self, work: Callable[["Job"], None]):
        self.work = work
        self._outputs: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()

    # ---- worker side
    def emit(self, item: Any) -> None:
        self._outputs.put(item)

    def check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise Cancelled()

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
            self.cancel()  # a caller that stops early frees the worker at its next check


class GPUWorker:
    def __init__(self, max_queue: int, name: str = "s1-gpu-worker"):
        self.max_queue = max_queue
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._running = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[Job], None]) -> Job:
        with self._lock:
            if self._queue.qsize() >= self.max_queue:
                raise QueueFullError(f"the engine is busy ({self._queue.qsize()} requests waiting); retry shortly",
                                     retry_after_s=2.0)
            job = Job(work)
            self._queue.put(job)
        return job

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the worker thread and return its result (for set-up work such as warm-up)."""
        job = self.submit(lambda j: j.emit(fn()))
        return next(iter(job.results()))

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def running(self) -> int:
        return self._running

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            if job.cancelled:
                job.emit(_DONE)
                continue
            self._running = 1
            try:
                job.work(job)
            except Cancelled:
                pass
            except Exception as exc:  # reported to that caller; the worker serves the next job
                if not isinstance(exc, ValueError):
                    logger.exception("request failed on the GPU worker")
                job.emit(exc)
            finally:
                self._running = 0
                job.emit(_DONE)
