"""The GPU worker's loop: jobs and decode iterations take turns."""

import threading
import time

from engine.runtime import worker as worker_module
from engine.runtime.worker import GPUWorker


def test_a_burst_of_slow_jobs_takes_turns_with_the_running_decode_loop(monkeypatch):
    """Each job below takes longer than the set-up budget, so while the decode loop has work an
    iteration runs after every job instead of after the whole burst."""
    monkeypatch.setattr(worker_module, "SETUP_BUDGET_S", 0.005)
    events, lock, remaining = [], threading.Lock(), [20]

    def iterate() -> bool:
        with lock:
            events.append("iterate")
            remaining[0] -= 1
            return remaining[0] > 0

    gpu = GPUWorker(capacity=16, iterate=iterate)
    try:
        gate = threading.Event()
        first = gpu.submit(lambda job: (gate.wait(5), job.finish()))  # holds the loop while the burst queues

        def slow(name):
            def work(job):
                time.sleep(0.01)
                with lock:
                    events.append(name)
                job.finish()
            return work

        burst = [gpu.submit(slow(f"job{i}")) for i in range(4)]
        gate.set()
        for job in [first, *burst]:
            list(job.results())
        deadline = time.monotonic() + 5
        while remaining[0] > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gpu.close()
    jobs = [i for i, e in enumerate(events) if e.startswith("job")]
    assert len(jobs) == 4
    # Between any two jobs of the burst the decode loop ran at least once.
    assert all("iterate" in events[a + 1:b] for a, b in zip(jobs, jobs[1:])), events


def test_quick_jobs_of_a_burst_run_together_within_the_budget(monkeypatch):
    monkeypatch.setattr(worker_module, "SETUP_BUDGET_S", 10.0)
    events, lock = [], threading.Lock()

    def iterate() -> bool:
        with lock:
            events.append("iterate")
        return False

    gpu = GPUWorker(capacity=16, iterate=iterate)
    try:
        gate = threading.Event()
        first = gpu.submit(lambda job: (gate.wait(5), job.finish()))

        def quick(name):
            def work(job):
                with lock:
                    events.append(name)
                job.finish()
            return work

        burst = [gpu.submit(quick(f"job{i}")) for i in range(4)]
        gate.set()
        for job in [first, *burst]:
            list(job.results())
        time.sleep(0.05)
    finally:
        gpu.close()
    jobs = [i for i, e in enumerate(events) if e.startswith("job")]
    assert jobs == list(range(jobs[0], jobs[0] + 4)), events  # no iteration in between
