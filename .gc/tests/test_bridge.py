"""app.bridge: kept stream threads, and reading a generator on them from asyncio."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from app.bridge import StreamThreads, iterate_in_thread

WAIT_S = 10


def test_a_thread_is_reused_once_its_work_is_done():
    threads = StreamThreads("test-stream")
    names = []
    for _ in range(5):
        done = threading.Event()
        threads.run(lambda done=done: (names.append(threading.current_thread().name), done.set()))
        assert done.wait(WAIT_S)
        _until_idle(threads, 1)
    assert threads.threads == 1 and names == ["test-stream"] * 5


def test_works_at_once_each_get_a_thread_and_kept_threads_are_started_ahead():
    threads = StreamThreads()
    threads.keep(4)
    assert threads.threads == 4
    barrier = threading.Barrier(7, timeout=WAIT_S)  # six works that only finish together, and this test
    for _ in range(6):
        threads.run(barrier.wait)
    barrier.wait()  # would time out if a work waited for another's thread
    assert threads.threads == 6
    threads.keep(3)
    assert threads.threads == 6


def _until_idle(threads: StreamThreads, idle: int) -> None:
    """Wait until `idle` threads are idle (a thread counts itself idle just after its work)."""
    for _ in range(WAIT_S * 1000):
        if threads._idle == idle:
            return
        threading.Event().wait(0.001)
    raise AssertionError(f"{threads._idle} threads idle, not {idle}")


def test_a_failing_work_is_logged_and_its_thread_serves_on(caplog):
    threads = StreamThreads()
    done = threading.Event()
    with caplog.at_level(logging.ERROR, logger="app"):
        threads.run(lambda: 1 / 0)
        _until_idle(threads, 1)
        threads.run(done.set)
        assert done.wait(WAIT_S)
    assert "a stream thread's work failed" in caplog.text and threads.threads == 1


def test_a_thread_that_cannot_start_queues_nothing_and_counts_nothing(monkeypatch):
    threads = StreamThreads()
    ran = []
    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("can't start")))
        with pytest.raises(RuntimeError):
            threads.run(lambda: ran.append("orphan"))  # the request fails here: its work must never run
        with pytest.raises(RuntimeError):
            threads.keep(2)
    assert threads.threads == 0 and threads._idle == 0
    done = threading.Event()
    threads.run(lambda: (ran.append("next"), done.set()))
    assert done.wait(WAIT_S)
    _until_idle(threads, 1)
    assert ran == ["next"] and threads.threads == 1


def test_an_idle_thread_keeps_nothing_of_its_last_work():
    import gc
    import weakref

    class Payload:
        pass

    threads = StreamThreads()
    payload = Payload()
    alive = weakref.ref(payload)
    done = threading.Event()
    threads.run(lambda payload=payload: done.set())
    del payload
    assert done.wait(WAIT_S)
    _until_idle(threads, 1)
    gc.collect()
    assert alive() is None


def test_a_reader_that_stops_early_closes_the_generator_on_its_thread():
    closed, made = threading.Event(), threading.Event()
    closed_on = []

    def chunks():
        made.set()
        try:
            for i in range(1000):
                yield i
        finally:
            closed_on.append(threading.current_thread().name)
            closed.set()

    async def read_two():
        got = []
        stream = iterate_in_thread(chunks)
        async for item in stream:
            got.append(item)
            if len(got) == 2:
                break
        await stream.aclose()
        return got

    assert asyncio.run(read_two()) == [0, 1]
    assert made.is_set() and closed.wait(WAIT_S) and closed_on == ["engine-stream"]


def test_a_generator_s_error_reaches_the_reader():
    def chunks():
        yield 1
        raise ValueError("bad chunk")

    async def read_all():
        return [item async for item in iterate_in_thread(chunks)]

    with pytest.raises(ValueError, match="bad chunk"):
        asyncio.run(read_all())
