"""Static KV storage with one slot per sequence.

Storage is allocated once: (layers, slots, kv_heads, capacity, head_dim) for keys and values. Batch
row b of a call uses slot b, so a call's keys and values are views, never gathered copies.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.dual_ar import KVView


def bytes_per_slot(n_layers: int, n_kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype) -> int:
    """Keys and values of one sequence of `capacity` positions."""
    return 2 * n_layers * n_kv_heads * capacity * head_dim * torch.empty(0, dtype=dtype).element_size()


class KVCache:
    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (n_layers, n_slots, n_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.n_slots = n_slots
        self._constant_positions: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}

    def views(self, positions: Tensor, kv_len: int | Tensor, first_slot: int = 0, *,
              all_visible: bool = False) -> list[KVView]:
        """One KVView per layer for a call writing `positions` (B, S) of slots first_slot.. first_slot+B-1
        and reading the first kv_len positions (an int, or the key positions arange(kv_len) themselves).

        The mask (key j visible to a query at position p when j <= p) is built here once for all
        layers; all_visible=True skips it when the caller knows every key read is visible.
        """
        key_positions = kv_len if isinstance(kv_len, Tensor) else torch.arange(kv_len, device=self.k.device)
        if key_positions.shape[0] > self.capacity:
            raise ValueError(f"kv_len {key_positions.shape[0]} exceeds the cache capacity {self.capacity}")
        mask = None if all_visible else (key_positions <= positions[:, None, :, None])
        rows = slice(first_slot, first_slot + positions.shape[0])
        return [KVView(self.k[i, rows], self.v[i, rows], positions, key_positions, mask)
                for i in range(self.k.shape[0])]

    def codebook_positions(self, batch: int, position: int) -> tuple[Tensor, Tensor]:
        """(positions (batch, 1) all equal to `position`, arange(position + 1)), made once and reused,
        so that a captured step replays no kernels to rebuild them."""
        key = (batch, position)
        if key not in self._constant_positions:
            device = self.k.device
            self._constant_positions[key] = (torch.full((batch, 1), position, dtype=torch.int64, device=device),
                                             torch.arange(position + 1, device=device))
        return self._constant_positions[key]

