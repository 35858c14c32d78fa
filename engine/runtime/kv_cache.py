"""Static KV storage with one slot per sequence.

Storage is allocated once: (layers, slots, kv_heads, capacity, head_dim) for keys and values. Batch
row b of a call uses slot b, so a call's keys and values are views, never gathered copies.
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

    def views(self, positions: Tensor, kv_len: int | Tensor, first_slot: int = 0) -> list[KVView]:
        """One KVView per layer for a call writing `positions` (B, S) of slots first_slot.. first_slot+B-1
        and reading the first kv_len positions (an int, or the key positions arange(kv_len) themselves)."""
        key_positions = kv_len if isinstance(kv_len, Tensor) else torch.arange(kv_len, device=self.k.device)
        if key_positions.shape[0] > self.capacity:
            raise ValueError(f"kv_len {key_positions.shape[0]} exceeds the cache capacity {self.capacity}")
        rows = slice(first_slot, first_slot + positions.shape[0])
        return [KVView(self.k[i, rows], self.v[i, rows], positions, key_positions) for i in range(self.k.shape[0])]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    @staticmethod
    def bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * n_layers * n_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

