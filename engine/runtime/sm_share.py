"""A CUDA stream whose kernels run on part of the GPU's SMs only (a green context), for the codec.

On streams that share every SM, the codec's chunks and the batched decode steps take turns rather
than overlap: the codec's kernels fill all SMs, and each of a step's short dependent kernels waits
for SMs to free up, whatever the streams' priorities (docs/PERFORMANCE.md, 2026-11-25). With the
codec confined to a share of the SMs, the steps always find SMs of their own.

A CUDA graph keeps the SM limit of the stream it was captured on, so the codec runner captures its
graphs on this stream. Its work is ordered with other streams' through events, as any stream's, and
`torch.cuda.synchronize()` waits for it too (H100, torch 2.11: docs/benchmarks/session-s41's probe).
Needs torch's `torch.cuda.green_contexts` and a driver that supports them; without either, the codec
shares every SM and the log says why."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from loguru import logger


@dataclass
class SideStream:
    stream: torch.cuda.Stream
    sms: int | None  # SMs its kernels may use; None: every SM of the GPU
    context: object = None  # the green context, which must outlive its stream


def side_stream(device: torch.device, share: float, purpose: str) -> SideStream:
    """A new stream for `purpose` (named in the log) limited to `share` of the device's SMs when
    0 < share < 1 and a green context can be made; otherwise a plain stream on every SM."""
    if not 0 < share < 1:
        return SideStream(torch.cuda.Stream(device), None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).multi_processor_count
    sms = max(1, round(total * share))
    try:
        from torch.cuda.green_contexts import GreenContext

        context = GreenContext.create(num_sms=sms, device_id=index)
        stream = context.Stream()
    except Exception as error:  # an older torch or driver: every SM, and say so
        logger.warning("{} runs on all {} SMs: no green context of {} SMs could be made ({})",
                       purpose, total, sms, error)
        return SideStream(torch.cuda.Stream(device), None)
    logger.info("{} runs on {} of the GPU's {} SMs (a green context)", purpose, sms, total)
    return SideStream(stream, sms, context)
