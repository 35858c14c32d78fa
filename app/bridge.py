"""Run the engine's synchronous chunk generator on a worker thread and read it from asyncio.

The event loop never blocks on the engine. When the reader stops early (the client went away),
the worker stops asking for chunks and closes the generator on its own thread, which lets the
engine cancel the request and free its slot.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_ITEM, _ERROR, _END = range(3)


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

    worker = threading.Thread(target=work, name="engine-stream", daemon=True)
    worker.start()
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
