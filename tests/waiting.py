"""Waiting in a test for what another thread or process brings about, failing with what was awaited."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 60.0, poll_s: float = 0.01,
               detail: Callable[[], str] = lambda: "") -> None:
    """Return once condition() is true, polled every poll_s; past timeout_s the test fails, naming
    what it waited for and adding detail() (a server's log, an engine's stats)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}\n{detail()}".rstrip())
        time.sleep(poll_s)
