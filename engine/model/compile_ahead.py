"""Our Triton kernels compiled ahead, many at once, instead of one after another at first launch.

Triton compiles a kernel's variant (its constexprs, its arguments' alignments) the first time it is
launched, on the launching thread, while everything else on that thread waits: the codec decoder's
graphs alone launch dozens of variants of the conv kernel (tiles by row bucket, epilogues), a
large share of a first start. Inside `compiling_ahead()`, the launch sites that go through
`launch()` ask Triton to compile instead (the kernel's warmup under Triton's AsyncCompileMode,
which compiles on a thread pool and returns at once) and do not run the kernel: a pass over the
calls to come, with outputs left unwritten, queues every variant they need. Leaving the block
waits for all of them; the real calls then find them compiled (and a later start in Triton's cache).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from loguru import logger

try:
    import triton
except ImportError:
    triton = None

_ahead: contextvars.ContextVar[bool] = contextvars.ContextVar("compiling_ahead", default=False)


def available() -> bool:
    """Whether this Triton compiles asynchronously (its AsyncCompileMode, which Triton 3.6 has)."""
    return triton is not None and hasattr(triton, "AsyncCompileMode")


@contextlib.contextmanager
def compiling_ahead(workers: int | None = None) -> Iterator[bool]:
    """Inside, launch() compiles without running, `workers` compiles at a time (default: the CPU
    count, at most 16); on leaving, waits for them all and raises the first compile error. Yields
    whether compiles go ahead: where Triton cannot (available()), launch() runs kernels as ever and
    the block changes nothing."""
    if not available() or _ahead.get():
        yield False
        return
    workers = workers or min(16, os.cpu_count() or 1)
    started = time.perf_counter()
    with ThreadPoolExecutor(workers, thread_name_prefix="triton-compile") as pool:
        with triton.AsyncCompileMode(pool) as mode:
            token = _ahead.set(True)
            try:
                yield True
            finally:
                _ahead.reset(token)
                queued = len(getattr(mode, "future_kernels", ()))  # Triton's own count, cleared on exit
    logger.debug("compiled {} Triton kernels ahead on {} threads in {:.1f} s", queued, workers,
                 time.perf_counter() - started)


def launch(kernel, grid, *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), or inside compiling_ahead() only its compile, queued."""
    if _ahead.get():
        kernel.warmup(*args, grid=grid, **kwargs)
    else:
        kernel[grid](*args, **kwargs)
