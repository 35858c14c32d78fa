"""Run the engine's synchronous chunk generator on a worker thread and read it from asyncio.

The event loop never blocks on the engine. When the reader stops early (the client went away),
the worker stops asking for chunks and closes the generator on its own thread, which lets the
engine cancel the request and free its slot.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

from .errors import problem_for

T = TypeVar("T")

_ITEM, _ERROR, _END = range(3)
log = logging.getLogger("app")


class StreamThreads:
    """Daemon threads that run streams' generators, kept between requests.

    Thread.start() waits until the new thread runs, a hand-over of the GIL: with the GPU worker and
    other streams busy that took ~3.5 ms on the event loop per request, one after another, and a
    burst of 64 requests reached the engine over ~250-340 ms (docs/PERFORMANCE.md). Here a request's
    work goes to an idle thread through a queue; a thread is started only when none is idle, and
    `keep(n)` starts n ahead (the server: as many as the engine takes requests at once). Threads are
    not retired: their number stays at the most works ever run at once (requests the engine refuses
    as over capacity included, since it refuses them on their thread). Daemon threads, like the
    one-per-request threads before: a stream blocked in the engine never holds up the process's exit.
    """

    def __init__(self, name: str = "engine-stream"):
        self._name = name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work that no queued item has claimed yet
        self._threads = 0

    def run(self, work: Callable[[], None]) -> None:
        with self._lock:
            claimed_idle = self._idle > 0
            self._idle -= claimed_idle
        if not claimed_idle:
            self._start()  # raises before anything is queued: no orphan work, no idle thread counted
        self._work.put(work)

    def keep(self, threads: int) -> None:
        """Start threads until at least `threads` exist, each idle."""
        with self._lock:
            missing = max(threads - self._threads, 0)
            self._idle += missing
        for started in range(missing):
            try:
                self._start()
            except BaseException:
                with self._lock:
                    self._idle -= missing - started
                raise

    @property
    def threads(self) -> int:
        return self._threads

    def _start(self) -> None:
        threading.Thread(target=self._serve, name=self._name, daemon=True).start()
        with self._lock:
            self._threads += 1

    def _serve(self) -> None:
        while True:
            work = self._work.get()
            try:
                work()
            except BaseException:  # iterate_in_thread's work hands its errors to the reader; anything else is a bug
                log.exception("a stream thread's work failed")
            work = None  # an idle thread must not keep its last request (voice, unread chunks, loop) alive
            with self._lock:
                self._idle += 1


STREAM_THREADS = StreamThreads()


async def first_then_rest(chunks: AsyncIterator[T]) -> AsyncIterator[T]:
    """Waits for the first item so that input errors still become a 4xx before any byte is sent;
    an error after that ends the stream and is logged (the headers are gone)."""
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        first = None

    async def rest():
        try:
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk
        except Exception as e:
            log.error("stream ended early: %s", problem_for(e).message)
        finally:
            await chunks.aclose()

    return rest()


async def iterate_in_thread(make_iterator: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def send(kind, value=None):
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    def work():
        iterator = None
        try:
            iterator = make_iterator()
            for item in iterator:
                if stop.is_set():
                    break
                send(_ITEM, item)
            send(_END)
        except BaseException as e:  # handed to the reader, which decides what it means
            send(_ERROR, e)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    STREAM_THREADS.run(work)
    try:
        while True:
            kind, value = await queue.get()
            if kind == _END:
                return
            if kind == _ERROR:
                raise value
            yield value
    finally:
        stop.set()
