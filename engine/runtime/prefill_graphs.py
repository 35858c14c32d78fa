"""Prefill replayed from CUDA graphs, one per (rows, columns) bucket.

A compiled prefill call still launches ~20 kernels a layer from Python, and each launch releases
the GIL and waits to take it back: while the server's event loop parses a burst of request bodies,
one row's prefill can take tens of times longer than its GPU work. A replay is one call, and copying
a group's inputs and outputs a few more.

A graph's addresses are fixed and a request's slot is not, so the graphs prefill staging rows of
their own: a row's columns before `start` (its voice prefix, or an earlier text chunk) are copied
from its slot into its staging row first, and the keys and values of its new columns are copied
back to its slot after the replay. Columns are padded on the right up to the bucket; a padded
column writes staging positions past the row's columns, which nothing copies back, and a query
sees only the keys at or before its position, so padding changes no real column's keys or values.
Every graph attends over all MAX_KV staging positions (masked): one graph per kv length would
triple the graphs, and the attention over 1,024 keys is a small part of a prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
from loguru import logger
from torch import Tensor

from ..model.dual_ar import KVView
from .cuda_graphs import capture
from .kv_cache import KVCache

ROW_BUCKETS = (1, 2, 4)
COLUMN_BUCKETS = (64, 128, 256, 512, 1024)
# The positions a graph attends over: a voice prefix of a 10 s clip is ~300 columns, its text ~100
# more. Longer prompts take the compiled call (see StepRunner.prefill_many).
MAX_KV = 1024
# Staging rows are a little longer than what the graphs read: the compiled prefill specialises on
# reading the whole storage (one more compile of each prefill region).
STAGING_SPARE = 16


class PrefillRow(NamedTuple):
    slot: int
    prompt: Tensor  # (1 + num_codebooks, L) ints
    start: int  # columns before start are in the slot's KV already
    end: int  # prefill columns start..end-1

    @property
    def width(self) -> int:
        return self.end - self.start


def _bucket(n: int, sizes) -> int | None:
    return next((size for size in sizes if size >= n), None)


def plan_groups(rows: list[PrefillRow], row_buckets, column_buckets,
                max_kv: int) -> tuple[list[list[PrefillRow]], list[PrefillRow]]:
    """Split rows into groups that one graph each can prefill (narrowest first, at most the largest
    row bucket a group, and the group's widest bucket past its latest start within max_kv);
    returns (groups, the rows no graph fits)."""
    groups: list[list[PrefillRow]] = []
    left = []
    for row in sorted(rows, key=lambda r: r.width):
        width = _bucket(row.width, column_buckets)
        if width is None or row.start + width > max_kv:
            left.append(row)
            continue
        group = groups[-1] if groups else None
        if group is not None and len(group) < row_buckets[-1] and max(r.start for r in group) + width <= max_kv:
            group.append(row)
        else:
            groups.append([row])
    return groups, left


class PrefillGraphs:
    def __init__(self, cache: KVCache, max_rows: int, prompt_rows: int):
        """cache: the slots' KV; max_rows: the most rows one graph prefills; prompt_rows: 1 + num_codebooks."""
        self.cache = cache
        self.max_kv = min(MAX_KV, cache.capacity)
        self.row_buckets = [rows for rows in ROW_BUCKETS if rows <= max_rows]
        self.column_buckets = [width for width in COLUMN_BUCKETS if width <= self.max_kv]
        layers, _, heads, _, head_dim = cache.k.shape
        device = cache.k.device
        self.staging = KVCache(layers, self.row_buckets[-1], heads, self.max_kv + STAGING_SPARE, head_dim,
                               cache.k.dtype, device)
        self.columns = torch.zeros(self.row_buckets[-1], prompt_rows, self.column_buckets[-1], dtype=torch.long,
                                   device=device)
        self.starts = torch.zeros(self.row_buckets[-1], dtype=torch.long, device=device)
        self.offsets = torch.arange(self.column_buckets[-1], device=device)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def capture(self, forward: Callable[[int, Tensor, list[KVView]], object], stream: torch.cuda.Stream) -> None:
        """Capture every bucket's graph of forward(rows, columns, kv views) on `stream`, in a memory
        pool of their own (~0.4 GB of activations at full size for 4 x 1,024 columns). One warm-up
        call each: the prefill regions were compiled before."""
        started, pool = time.perf_counter(), None
        self.starts.zero_()
        for rows in self.row_buckets:
            for width in self.column_buckets:
                graph, _ = capture(partial(self._call, forward, rows, width), stream, pool, warmup=1)
                pool = graph.pool()
                self._graphs[(rows, width)] = graph
        logger.info("captured {} prefill graphs (rows {}, columns up to {}) in {:.1f} s", len(self._graphs),
                    self.row_buckets, self.column_buckets[-1], time.perf_counter() - started)

    def _call(self, forward, rows: int, width: int):
        # Positions made outside inference mode, key positions and mask inside (by views()), as
        # StepRunner's compiled calls make theirs: the compiled prefill guards on which tensors are
        # inference tensors (each difference cost another compile of each prefill region).
        positions = self.starts[:rows, None] + self.offsets[:width]
        with torch.inference_mode():
            return forward(rows, self.columns[:rows, :, :width], self.staging.views(positions, self.max_kv))

    def run(self, rows: list[PrefillRow]) -> list[PrefillRow]:
        """Prefill the rows that fit a graph; returns those that do not (none before capture())."""
        if not self._graphs:
            return rows
        groups, left = plan_groups(rows, self.row_buckets, self.column_buckets, self.max_kv)
        for group in groups:
            self._replay(group)
        return left

    def _replay(self, group: list[PrefillRow]) -> None:
        n = _bucket(len(group), self.row_buckets)
        width = _bucket(max(row.width for row in group), self.column_buckets)
        staged, cache = self.staging, self.cache
        # Copies of all rows in one call each way: every torch call releases the GIL and waits to
        # take it back, up to milliseconds beside a busy event loop.
        targets, sources = [], []
        for i, row in enumerate(group):
            targets.append(self.columns[i, :, :row.width])
            sources.append(row.prompt[:, row.start:row.end])
            if row.start:
                targets += [staged.k[:, i, :, :row.start], staged.v[:, i, :, :row.start]]
                sources += [cache.k[:, row.slot, :, :row.start], cache.v[:, row.slot, :, :row.start]]
        torch._foreach_copy_(targets, sources)
        # Rows of the bucket past the group start at 0 and prefill stale (valid) ids into staging.
        # From pageable memory without waiting: CUDA copies it to a staging buffer at once.
        self.starts[:n].copy_(torch.tensor([row.start for row in group] + [0] * (n - len(group))), non_blocking=True)
        self._graphs[(n, width)].replay()
        targets, sources = [], []
        for i, row in enumerate(group):
            targets += [cache.k[:, row.slot, :, row.start:row.end], cache.v[:, row.slot, :, row.start:row.end]]
            sources += [staged.k[:, i, :, row.start:row.end], staged.v[:, i, :, row.start:row.end]]
        torch._foreach_copy_(targets, sources)
