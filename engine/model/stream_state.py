"""The state every streaming layer of the codec carries, and how a call reads and writes the rows
(streams) it continues: shared by the layer streamers (codec_streamers) and the channels-last
decoder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ..device import copy_may_overlap
from .codec_convs import WNConv, weight_norm


@dataclass(frozen=True)
class Rows:
    """Which of a decoder's B streams a call continues: the same indices on the device and the host."""

    index: Tensor  # (b,) int64 on the state's device
    host: np.ndarray  # (b,) int64

    @classmethod
    def of(cls, rows: Sequence[int], device) -> "Rows":
        host = np.asarray(rows, dtype=np.int64)
        return cls(torch.from_numpy(host).to(device, non_blocking=copy_may_overlap(device)), host)


def read_rows(state: Tensor, rows: Rows | None) -> Tensor:
    return state if rows is None else state[rows.index]


def write_rows(state: Tensor, rows: Rows | None, value: Tensor) -> None:
    if rows is None:
        state.copy_(value)
    else:
        state[rows.index] = value.to(state.dtype)


def zero_rows(state: Tensor, rows: Rows | None) -> None:
    if rows is None:
        state.zero_()
    else:
        state.index_fill_(0, rows.index, 0)  # a scalar argument: no host copy, so capturable


def conv_weight(conv: nn.Module) -> Tensor:
    """A Conv1d's or WNConv's (c_out, c_in, k) weight."""
    return weight_norm(*conv.g_v) if isinstance(conv, WNConv) else conv.weight


def new_state(batch: int, channels: int, length: int, like: nn.Module) -> Tensor:
    p = next(like.parameters())
    with torch.inference_mode(False):  # a normal tensor: updatable in place inside or outside inference mode
        return torch.zeros(batch, channels, length, device=p.device, dtype=p.dtype)
