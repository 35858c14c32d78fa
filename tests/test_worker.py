"""The GPU worker's background work: it runs only while the worker has nothing else to do."""

import queue
import threading

from engine.runtime import worker as worker_module
from engine.runtime.worker import GPUWorker

WAIT_S = 10  # a bound on waits for events that come at once: reached only when the worker is broken


class WatchedQueue(queue.Queue):
    """The worker's job queue, telling the test how the worker waits for jobs: `asleep` is set
    whenever it blocks with no timeout (nothing to iterate and no background work left), `waits`
    lists each wait's timeout and whether a job came."""

    def __init__(self):
        super().__init__()
        self.asleep = threading.Event()
        self.waits: list[tuple[float | None, str]] = []

    def get(self, block=True, timeout=None):
        if block and timeout is None:
            self.asleep.set()
        try:
            item = super().get(block, timeout)
        except queue.Empty:
            self.waits.append((timeout, "none"))
            raise
        self.waits.append((timeout, "job"))
        return item


def watched_worker(monkeypatch, **kwargs) -> tuple[GPUWorker, WatchedQueue]:
    made: list[WatchedQueue] = []
    with monkeypatch.context() as patch:
        patch.setattr(worker_module.queue, "Queue", lambda: made.append(WatchedQueue()) or made[-1])
        worker = GPUWorker(**kwargs)
    (jobs,) = made
    return worker, jobs


def test_idle_work_runs_in_units_until_done_and_jobs_go_first(monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 0.01)
    log: list[str] = []
    threads: set[str] = set()
    first_unit, release = threading.Event(), threading.Event()
    worker, jobs = watched_worker(monkeypatch, capacity=4)

    def one_unit() -> bool:
        log.append("unit")
        threads.add(threading.current_thread().name)
        first_unit.set()
        assert release.wait(WAIT_S)  # the first unit holds the worker until the test lets it go
        return log.count("unit") < 3

    try:
        # `asleep` is set again once the worker waits for jobs with no background work left.
        worker.call(lambda: (jobs.asleep.clear(), worker.when_idle(one_unit)))
        assert first_unit.wait(WAIT_S), "idle work never started"
        job = worker.submit(lambda j: (log.append("job"), j.emit("served"), j.finish()))  # arrives during the first unit
        release.set()
        assert list(job.results()) == ["served"]
        assert jobs.asleep.wait(WAIT_S), f"the worker kept background work it said was done: {log}"
        # The waiting job ran after the unit in progress, before the next one; done means not called again.
        assert log == ["unit", "job", "unit", "unit"]
        assert threads == {"s1-gpu-worker"}
    finally:
        worker.close()


def test_idle_work_waits_for_a_quiet_worker(monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 0.05)
    ran = threading.Event()
    waits_before: list[tuple[float | None, str]] = []
    worker, jobs = watched_worker(monkeypatch, capacity=4)

    def unit() -> bool:
        waits_before.extend(jobs.waits)
        ran.set()
        return False

    try:
        worker.call(lambda: worker.when_idle(unit))
        assert ran.wait(WAIT_S)
        # Right before it, the worker waited IDLE_AFTER_S for a job and none came.
        assert waits_before[-1] == (0.05, "none")
    finally:
        worker.close()


def test_failing_idle_work_is_logged_and_dropped_and_the_worker_serves_on(monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 0.01)
    calls = []
    worker, jobs = watched_worker(monkeypatch, capacity=4)

    def broken() -> bool:
        calls.append(1)
        raise RuntimeError("capture failed")

    try:
        worker.call(lambda: (jobs.asleep.clear(), worker.when_idle(broken)))
        assert jobs.asleep.wait(WAIT_S) and calls == [1], "the failing work was not dropped"
        assert worker.call(lambda: "still here") == "still here"
        assert calls == [1]
    finally:
        worker.close()


def test_on_start_runs_first_on_the_worker_thread_and_a_failing_one_leaves_it_serving():
    seen: list[str] = []
    worker = GPUWorker(capacity=2, on_start=lambda: seen.append(threading.current_thread().name))
    try:
        assert worker.call(lambda: list(seen)) == ["s1-gpu-worker"]
    finally:
        worker.close()

    def broken() -> None:
        raise RuntimeError("no stream today")

    worker = GPUWorker(capacity=2, on_start=broken)
    try:
        assert worker.call(lambda: "still serving") == "still serving"
    finally:
        worker.close()


def test_jobs_arriving_one_after_another_do_not_hold_up_the_decode_loop():
    """A burst of requests reaches the worker one job at a time; the decode loop still iterates
    after every round of waiting jobs, not only once the burst is over."""
    log: list[str] = []
    remaining = {"iterations": 0}
    worker_ref: list[GPUWorker] = []
    all_arrived = threading.Event()

    def iterate() -> bool:
        log.append("iterate")
        remaining["iterations"] -= 1
        return remaining["iterations"] > 0

    def arrival(n: int):
        def work(job) -> None:
            log.append("job")
            if n > 1:  # the next request arrives while this one is being handled
                worker_ref[0].submit(arrival(n - 1))
            else:
                all_arrived.set()
            job.finish()
        return work

    worker = GPUWorker(capacity=64, step=iterate)
    worker_ref.append(worker)
    try:
        def start() -> None:
            remaining["iterations"] = 1000  # the decode loop has work from now on
            worker.submit(arrival(20))

        worker.call(start)
        assert all_arrived.wait(WAIT_S), f"the jobs did not all run: {log.count('job')}"
        first_jobs = log[:log.index("job") + 40]
        runs = "".join("j" if entry == "job" else "i" for entry in first_jobs)
        assert "jj" not in runs.strip("i"), f"jobs ran back to back while the loop had work: {runs}"
    finally:
        worker.close()
