"""Run the engine's synchronous calls and chunk generators on threads of their own and await them
from asyncio.

The event loop never blocks on the engine, and no generation work waits in (or fills) Starlette's
shared thread pool, which other routes need. When the reader stops early (the client went away),
the worker stops asking for chunks and closes the generator on its own thread, which lets the
engine cancel the request and free its slot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

from .errors import problem_for

T = TypeVar("T")

_ITEM, _ERROR, _END = range(3)
log = logging.getLogger("app")


class StreamThreads:
    """Daemon threads that run streams' generators, kept between requests.

    Thread.start() waits until the new thread runs, a hand-over of the GIL: with the GPU worker and
    other streams busy that costs milliseconds on the event loop per request, one after another, and
    a burst of requests would reach the engine spread over a few hundred ms. Instead, a request's work
    goes to an idle thread through a queue; a thread is started only when none is idle, and
    `keep(n)` starts n ahead (the server: as many as the engine takes requests at once).
    Threads are not retired: their number stays at the most works ever run at once (requests the
    engine refuses as over capacity included, since it refuses them on their thread). They are
    daemon threads, so a stream blocked in the engine never holds up the process's exit.
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
    an error after that is logged and aborts the response (no final chunk: the headers are gone),
    so that the client sees an error instead of a short file that looks complete."""
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
            raise
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


async def call_in_thread(fn: Callable[[], T]) -> T:
    """fn() on a StreamThreads thread; its result or exception here."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work():
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as e:  # handed to the awaiting caller
            future.set_exception(e)

    STREAM_THREADS.run(work)
    return await asyncio.wrap_future(future)


async def until_disconnected(receive, work: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, work's result), or (False, None) once the client disconnects first, with `work`
    cancelled (an iterate_in_thread it reads stops, and its request leaves the engine).

    receive: the request's ASGI receive, called only after its body has been read.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            try:
                await task  # its clean-up (closing the stream it reads) runs before we answer
            except asyncio.CancelledError:
                pass
    if task.cancelled():
        return False, None
    return True, task.result()


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
