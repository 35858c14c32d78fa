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
        for _ in range(1000):  # the thread counts itself idle right after its work
            if threads._idle == 1:
                break
            threading.Event().wait(0.001)
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


def test_a_failing_work_is_logged_and_its_thread_serves_on(caplog):
    threads = StreamThreads()
    done = threading.Event()
    with caplog.at_level(logging.ERROR, logger="app"):
        threads.run(lambda: 1 / 0)
        threads.run(done.set)
        assert done.wait(WAIT_S)
    assert "a stream thread's work failed" in caplog.text and threads.threads <= 2


def test_a_reader_that_stops_early_closes_the_generator_on_its_thread():
    closed, made = threading.Event(), threading.Event()

    def chunks():
        made.set()
        try:
            for i in range(1000):
                yield i
        finally:
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
    assert made.is_set() and closed.wait(WAIT_S)


def test_a_generator_s_error_reaches_the_reader():
    def chunks():
        yield 1
        raise ValueError("bad chunk")

    async def read_all():
        return [item async for item in iterate_in_thread(chunks)]

    with pytest.raises(ValueError, match="bad chunk"):
        asyncio.run(read_all())
