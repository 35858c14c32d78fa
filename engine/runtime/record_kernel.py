"""The decode step's bookkeeping (decode_step.record_frame) as one Triton kernel, one program per row.

Compiled by Inductor, record_frame is 10-11 kernels a frame (two of them ATen scatters), each
starting after the one before. Here a program reads its row's frame and state once and writes the row's
history entry, its frame into its frames, done, length, and its next column and position: the same
integers as record_frame (tests/test_record_kernel.py). Launched with programmatic dependent launch
where available: it waits for the kernel before it (the frame's stack) before any load or store.
Importing this module needs Triton and torch >= 2.6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..compilation import pdl_available
from ..model.launch_control import launch_options, wait_for_inputs


@triton.jit
def _record_rows(frame_ptr, active_ptr, history_ptr, generated_ptr, frames_ptr, done_ptr, length_ptr, columns_ptr,
                 positions_ptr, im_end_id, capacity, history_stride, frames_stride,
                 WIDTH: tl.constexpr, WINDOW: tl.constexpr, BLOCK: tl.constexpr, pdl: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if pdl:  # every address after the wait (the wait is pure assembly: only what depends on it is ordered)
        b += wait_for_inputs()
    c = tl.arange(0, BLOCK)
    column = c < WIDTH
    frame = tl.load(frame_ptr + b * WIDTH + c, mask=column, other=0)
    token = tl.load(frame_ptr + b * WIDTH)
    active = tl.load(active_ptr + b)
    generated = tl.load(generated_ptr + b)
    # FrameHistory.push: history row 0 holds the token, row r > 0 code r (the frame's column r + 1).
    row = c < WIDTH - 1
    entry = tl.load(frame_ptr + b * WIDTH + tl.where(c == 0, 0, c + 1), mask=row, other=0)
    tl.store(history_ptr + b * history_stride + c * WINDOW + generated % WINDOW, entry, mask=row)
    generated += active
    tl.store(generated_ptr + b, generated)
    # An idle row (never started: generated is 0) rewrites frame 0 of its unused slot.
    tl.store(frames_ptr + b * frames_stride + c * capacity + tl.maximum(generated - 1, 0), frame, mask=column)
    done = tl.load(done_ptr + b) != 0
    is_end = token == im_end_id
    tl.store(length_ptr + b, tl.load(length_ptr + b) + tl.where(done | is_end, 0, active))
    tl.store(done_ptr + b, (done | is_end).to(tl.int8))
    tl.store(columns_ptr + b * WIDTH + c, frame, mask=column)
    tl.store(positions_ptr + b, tl.load(positions_ptr + b) + active)


# No defaults: torch drops a mutated custom-op argument that has one.
@torch.library.custom_op("s1mini::record_rows",
                         mutates_args=("history", "generated", "frames", "done", "length", "columns", "positions"))
def record_rows(frame: Tensor, active: Tensor, history: Tensor, generated: Tensor, frames: Tensor, done: Tensor,
                length: Tensor, columns: Tensor, positions: Tensor, im_end_id: int) -> None:
    """decode_step.record_frame on DecodeState's tensors: frame (B, W) int64 (W = 1 + num_codebooks);
    active, generated, length, positions (B,) int64; history (B, W - 1, window) int64; frames (B, W,
    capacity) int64; done (B,) bool; columns (B, W) int64. Rows and entries as DecodeState lays them out."""
    batch, width = frame.shape
    window, capacity = history.shape[2], frames.shape[2]
    torch._check(frame.is_contiguous() and columns.is_contiguous(), lambda: "frame and columns must be contiguous")
    torch._check(history.stride(1) == window and history.stride(2) == 1 and frames.stride(1) == capacity
                 and frames.stride(2) == 1, lambda: "history and frames need contiguous rows")
    for t in (active, generated, done, length, positions):
        torch._check(t.stride(0) == 1, lambda: "per-row state must be contiguous")
    if batch == 0:
        return
    pdl = pdl_available(frame.device)
    _record_rows[(batch,)](frame, active, history, generated, frames, done.view(torch.int8), length, columns,
                           positions, im_end_id, capacity, history.stride(0), frames.stride(0),
                           WIDTH=width, WINDOW=window, BLOCK=triton.next_power_of_2(width), pdl=pdl, **launch_options(pdl),
                           num_warps=1)


@record_rows.register_fake
def _(frame, active, history, generated, frames, done, length, columns, positions, im_end_id) -> None:
    return None
