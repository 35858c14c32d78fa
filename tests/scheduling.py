"""Helpers for driving a DecodeLoop or a StepRunner directly in tests: an owner that records what it
is given, and a check that two runners prefilled the same keys and values."""

from __future__ import annotations

import torch

from engine.runtime.decode_loop import DecodeLoop


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


def step(loop: DecodeLoop) -> None:
    """One step, its frames handed to their owners."""
    for h in loop.step():
        h.owner.take(h.codes, h.first, h.final)


def run_until_idle(loop: DecodeLoop, on_step=lambda i: None, limit: int = 10_000) -> int:
    """Step until nothing runs or waits; on_step(i) runs before step i. Returns the steps."""
    for i in range(limit):
        on_step(i)
        if not loop.busy:
            return i
        step(loop)
    raise AssertionError(f"still busy after {limit} steps")


def assert_same_kv(cache, other, rows, tolerance: float) -> None:
    """Every prompt column that prefill rows (slot, prompt, start) wrote (all but the last column)
    has the same keys and values in both KV caches, within `tolerance`."""
    for slot, prompt, _ in rows:
        written = prompt.shape[1] - 1
        for name in ("k", "v"):
            torch.testing.assert_close(getattr(cache, name)[:, slot, :, :written],
                                       getattr(other, name)[:, slot, :, :written], atol=tolerance, rtol=tolerance)
