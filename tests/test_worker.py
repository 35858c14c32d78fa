"""The GPU worker's background work: it runs only while the worker has nothing else to do."""

import threading
import time

from engine.runtime import worker as worker_module
from engine.runtime.worker import GPUWorker


def test_idle_work_runs_in_units_until_done_and_jobs_go_first(monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 0.05)
    units: list[str] = []
    release = threading.Event()

    def one_unit() -> bool:
        units.append(threading.current_thread().name)
        release.wait(5)  # the first unit holds the worker until the test lets it go
        return len(units) < 3

    worker = GPUWorker(capacity=4)
    try:
        worker.call(lambda: worker.when_idle(one_unit))
        deadline = time.monotonic() + 5
        while not units:
            assert time.monotonic() < deadline, "idle work never started"
            time.sleep(0.01)
        job = worker.submit(lambda j: (j.emit("served"), j.finish()))  # arrives during the first unit
        release.set()
        assert list(job.results()) == ["served"]
        assert len(units) == 1, "the waiting job ran after the unit in progress, before the next one"
        deadline = time.monotonic() + 5
        while len(units) < 3:
            assert time.monotonic() < deadline, f"idle work stopped early: {units}"
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(units) == 3  # it said it was done: not called again
        assert set(units) == {"s1-gpu-worker"}
    finally:
        worker.close()


def test_idle_work_waits_for_a_quiet_worker(monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 0.3)
    calls: list[float] = []
    worker = GPUWorker(capacity=4)
    try:
        registered = time.monotonic()
        worker.call(lambda: worker.when_idle(lambda: calls.append(time.monotonic()) or False))
        deadline = time.monotonic() + 5
        while not calls:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert calls[0] - registered >= 0.3
    finally:
        worker.close()


def test_failing_idle_work_is_logged_and_dropped_and_the_worker_serves_on(monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 0.01)
    calls = []

    def broken() -> bool:
        calls.append(1)
        raise RuntimeError("capture failed")

    worker = GPUWorker(capacity=4)
    try:
        worker.call(lambda: worker.when_idle(broken))
        time.sleep(0.3)
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

    def iterate() -> bool:
        log.append("iterate")
        remaining["iterations"] -= 1
        return remaining["iterations"] > 0

    def arrival(n: int):
        def work(job) -> None:
            log.append("job")
            if n > 1:  # the next request arrives while this one is being handled
                worker_ref[0].submit(arrival(n - 1))
            job.finish()
        return work

    worker = GPUWorker(capacity=64, step=iterate)
    worker_ref.append(worker)
    try:
        def start() -> None:
            remaining["iterations"] = 1000  # the decode loop has work from now on
            worker.submit(arrival(20))

        worker.call(start)
        deadline = time.monotonic() + 5
        while log.count("job") < 20:
            assert time.monotonic() < deadline, f"the jobs did not all run: {log.count('job')}"
            time.sleep(0.01)
        first_jobs = log[:log.index("job") + 40]
        runs = "".join("j" if entry == "job" else "i" for entry in first_jobs)
        assert "jj" not in runs.strip("i"), f"jobs ran back to back while the loop had work: {runs}"
    finally:
        worker.close()
