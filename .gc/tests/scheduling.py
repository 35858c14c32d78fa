"""Helpers for driving a Scheduler or a StepRunner directly in tests: an owner that records what it
is given, and a check that two runners prefilled the same keys and values."""

from __future__ import annotations

import torch

from engine.runtime.scheduler import Scheduler


class Collector:
    """A sequence owner: keeps the codes handed out (copied, as they are views) and any failure."""

    def __init__(self):
        self.blocks: list[torch.Tensor] = []
        self.firsts: list[bool] = []
        self.error: BaseException | None = None
        self.finished = False
        self.cancelled = False

    def fail(self, exc: BaseException) -> None:
        self.error = exc

    def take(self, codes: torch.Tensor, first: bool, final: bool) -> None:
        self.blocks.append(codes.clone())
        self.firsts.append(first)
        self.finished = final

    @property
    def codes(self) -> torch.Tensor:
        return torch.cat(self.blocks, dim=1)


def run_until_idle(scheduler: Scheduler, on_iteration=lambda i: None, limit: int = 10_000) -> int:
    """Iterate until nothing runs or waits; on_iteration(i) runs before iteration i. Returns iterations."""
    for i in range(limit):
        on_iteration(i)
        if not scheduler.busy:
            return i
        for h in scheduler.iteration():
            h.owner.take(h.codes, h.first, h.final)
    raise AssertionError(f"still busy after {limit} iterations")


def assert_same_kv(cache, other, rows, tolerance: float) -> None:
    """Every prompt column that prefill rows (slot, prompt, start) wrote (all but the last column)
    has the same keys and values in both KV caches, within `tolerance`."""
    for slot, prompt, _ in rows:
        written = prompt.shape[1] - 1
        for name in ("k", "v"):
            torch.testing.assert_close(getattr(cache, name)[:, slot, :, :written],
                                       getattr(other, name)[:, slot, :, :written], atol=tolerance, rtol=tolerance)
