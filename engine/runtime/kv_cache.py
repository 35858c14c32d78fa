"""Static KV storage with one slot per sequence, and the slot bookkeeping around it.

Storage is allocated once: (layers, slots, kv_heads, capacity, head_dim) for keys and values.
A sequence owns one slot from admission to retirement; its length is tracked here so attention can
read live positions only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.dual_ar import KVView


class KVCache:
    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (n_layers, n_slots, n_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.n_slots = n_slots

    def views(self, rows: Tensor, positions: Tensor, kv_len: int) -> list[KVView]:
        """One KVView per layer for a call writing `positions` (B, S) of the given slot `rows` (B,)."""
        if kv_len > self.capacity:
            raise ValueError(f"kv_len {kv_len} exceeds the cache capacity {self.capacity}")
        return [KVView(self.k[i], self.v[i], rows, positions, kv_len) for i in range(self.k.shape[0])]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    @staticmethod
    def bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * n_layers * n_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class SlotPool:
    """Free-list of KV slots and the live length of each (host-side integers)."""

    def __init__(self, n_slots: int):
        self._free = list(range(n_slots - 1, -1, -1))
        self.lengths = [0] * n_slots

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        if slot in self._free:
            raise RuntimeError(f"KV slot {slot} released twice")
        self.lengths[slot] = 0
        self._free.append(slot)

    @property
    def free_count(self) -> int:
        return len(self._free)
