"""Prefilled KV of voice prefixes, kept on the device and copied into a slot instead of recomputed.

Every prompt voiced by the same references starts with the same columns (`voice_prefix`), and
attention is causal, so their keys and values do not depend on the text after them. The first
request with a voice prefills its prefix alone and stores a copy here; later ones copy it into
their slot (a device copy of ~112 KiB per position at full size) and prefill only their text.
Entries are evicted least recently used when their bytes pass the budget.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor

from .kv_cache import KVCache


class PrefixCache:
    def __init__(self, cache: KVCache, max_bytes: int):
        self.cache, self.max_bytes = cache, max_bytes
        self._entries: OrderedDict[str, tuple[Tensor, Tensor]] = OrderedDict()
        self.hits = self.misses = 0

    @property
    def bytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, length: int) -> tuple[Tensor, Tensor] | None:
        """The stored prefix `key` of `length` positions (its keys and values), or None; counted as a
        hit or a miss. A caller holding it can still place() it after a later store() evicts it."""
        entry = self._entries.get(key)
        if entry is None or entry[0].shape[2] != length:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def place(self, rows: list[tuple[tuple[Tensor, Tensor], int]]) -> None:
        """Copy each (entry from get(), slot) into positions 0.. of its slot, all in one call: each
        torch call releases the GIL and waits to take it back, up to milliseconds beside a busy
        event loop, and a burst's admission places 16 prefixes at once."""
        if not rows:
            return
        targets, sources = [], []
        for (k, v), slot in rows:
            length = k.shape[2]
            targets += [self.cache.k[:, slot, :, :length], self.cache.v[:, slot, :, :length]]
            sources += [k, v]
        torch._foreach_copy_(targets, sources)

    def store(self, key: str, slot: int, length: int) -> None:
        """Keep a copy of positions 0..length-1 of `slot` (just prefilled) under `key`."""
        one = self.cache.k[:, slot, :, :length]
        if 2 * one.numel() * one.element_size() > self.max_bytes:
            return
        with torch.inference_mode():
            self._entries[key] = (one.clone(), self.cache.v[:, slot, :, :length].clone())
        self._entries.move_to_end(key)
        while self.bytes > self.max_bytes:
            self._entries.popitem(last=False)

    def stats(self) -> dict:
        return {"entries": len(self), "bytes": self.bytes, "hits": self.hits, "misses": self.misses}
