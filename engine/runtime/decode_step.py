"""The batched decode step: one frame for every row, with all state on the device.

`DecodeState` holds, per KV slot, the column to feed next, its position, the sampling parameters,
the repetition history, the frames produced so far, how many come before `<|im_end|>`, and
whether a sequence runs there at all. Rows of idle slots still compute inside a batch bucket
(padding) but do not advance, so they never write past their slot. `decode_step` reads and
updates it in place and needs nothing from the host but the batch size and a KV-length bucket, so
a compiled step can be captured as one CUDA graph per (batch bucket, kv bucket) and replayed frame
after frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..device import copy_may_overlap
from ..model.dual_ar import DualARTransformer
from .frame_sampler import FrameHistory, StepOps, next_frame
from .kv_cache import KVCache
from .sampling import SamplingTensors

try:  # the compiled step's bookkeeping in one kernel
    from . import record_kernel
except ImportError:  # no Triton: Inductor compiles record_frame's plain ops
    record_kernel = None


@dataclass
class DecodeState:
    columns: Tensor  # (S, 1 + num_codebooks) int64: the column fed at the next step
    positions: Tensor  # (S,) int64: where that column is written
    history: FrameHistory
    sampling: SamplingTensors
    frames: Tensor  # (S, 1 + num_codebooks, capacity) int64: frame i of slot s at [s, :, i]
    done: Tensor  # (S,) bool: the slot has produced <|im_end|>
    length: Tensor  # (S,) int64: frames produced before the first <|im_end|>
    active: Tensor  # (S,) int64: 1 while a sequence runs in the slot; idle rows stand still

    @classmethod
    def allocate(cls, n_slots: int, num_codebooks: int, capacity: int, device) -> "DecodeState":
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(*shape, dtype=dtype, device=device)

        sampling = SamplingTensors(zeros(n_slots, 1, dtype=torch.float32) + 1, zeros(n_slots, 1, dtype=torch.float32) + 1,
                                   zeros(n_slots, 1, dtype=torch.float32) + 1, zeros(n_slots))
        return cls(zeros(n_slots, 1 + num_codebooks), zeros(n_slots),
                   FrameHistory.empty(n_slots, num_codebooks, device), sampling,
                   zeros(n_slots, 1 + num_codebooks, capacity), zeros(n_slots, dtype=torch.bool), zeros(n_slots),
                   zeros(n_slots))

    def rows(self, batch: int) -> "DecodeState":
        """Views of slots 0..batch-1 (the same storage, so updates land in place)."""
        s = self.sampling
        return DecodeState(
            self.columns[:batch], self.positions[:batch],
            FrameHistory(self.history.ids[:batch], self.history.generated[:batch]),
            SamplingTensors(s.temperature[:batch], s.top_p[:batch], s.repetition_penalty[:batch], s.noise_key[:batch]),
            self.frames[:batch], self.done[:batch], self.length[:batch], self.active[:batch],
        )

    def start(self, slot: int, column: Tensor, position: int, temperature: float, top_p: float,
              repetition_penalty: float, noise_key: int) -> None:
        """Admit a sequence whose prompt, all but its last column, is already in the KV cache."""
        self.start_many([(slot, column, position, temperature, top_p, repetition_penalty, noise_key)])

    def start_many(self, rows: list[tuple[int, Tensor, int, float, float, float, int]]) -> None:
        """start() for several sequences, each row its arguments, in the same ~15 operations however
        many rows there are: each operation releases the GIL and waits to take it back, up to
        milliseconds each beside a thread parsing requests."""
        slots, columns, positions, temperatures, top_ps, penalties, keys = zip(*rows, strict=True)
        device = self.positions.device

        def upload(values, dtype):  # from pageable memory without waiting: CUDA stages it at once
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=copy_may_overlap(device))

        index = upload(slots, torch.int64)
        ints = upload([positions, keys], torch.int64)
        floats = upload([temperatures, top_ps, penalties], torch.float32)[:, :, None]
        self.columns.index_copy_(0, index, torch.stack(columns).to(self.columns.dtype))
        self.positions.index_copy_(0, index, ints[0])
        self.sampling.noise_key.index_copy_(0, index, ints[1])
        self.sampling.temperature.index_copy_(0, index, floats[0])
        self.sampling.top_p.index_copy_(0, index, floats[1])
        self.sampling.repetition_penalty.index_copy_(0, index, floats[2])
        for tensor, value in ((self.history.ids, 0), (self.history.generated, 0), (self.done, False),
                              (self.length, 0), (self.active, 1)):
            tensor.index_fill_(0, index, value)

    def stop(self, slot: int) -> None:
        """Free the slot: its row keeps running inside larger batches but no longer advances, and
        writes its KV at position 0 (its last position may be the cache's end). Fills on the device:
        `tensor[i] = 0` would copy a host scalar, which on CUDA waits for the stream's queued steps."""
        self.active[slot].zero_()
        self.positions[slot].zero_()


def decode_step(model: DualARTransformer, head, cache: KVCache, fast_cache: KVCache, state: DecodeState,
                key_positions: Tensor, ops: StepOps = StepOps()) -> None:
    """Advance every row of `state` (slots 0..B-1) by one frame. key_positions: arange(kv_len)."""
    views = cache.views(state.positions[:, None], key_positions)
    hidden = model.forward_slow(state.columns[:, :, None], views, ops.slow_block, ops.embed)
    frame = next_frame(model, head, hidden, state.sampling, state.history, fast_cache, ops)
    (ops.record or record_frame)(state, frame, model.layout.im_end_id)


def record_frame(state: DecodeState, frame: Tensor, im_end_id: int) -> None:
    """Record each row's new frame (B, 1 + num_codebooks): in its history and its frames, and
    advance the rows that run (one unit: compiled for CUDA, one record_kernel kernel)."""
    if record_kernel is not None and frame.is_cuda and torch.compiler.is_compiling():
        h = state.history
        record_kernel.record_rows(frame, state.active, h.ids, h.generated, state.frames, state.done, state.length,
                                  state.columns, state.positions, im_end_id)
        return
    state.history.push(frame, state.active)
    # An idle row (never started: generated is 0) rewrites frame 0 of its unused slot.
    index = (state.history.generated - 1).clamp_min(0)[:, None, None].expand(-1, frame.shape[1], 1)
    state.frames.scatter_(2, index, frame[:, :, None])
    is_end = frame[:, 0] == im_end_id
    state.length += state.active * ~(state.done | is_end)
    state.done |= is_end
    state.columns.copy_(frame)
    state.positions += state.active
