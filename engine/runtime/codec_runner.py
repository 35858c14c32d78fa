"""Harvested frames -> audio, for every running sequence at once, beside the decode steps.

One streaming codec decoder holds a stream (row) per KV slot. The frames harvested in one
scheduler iteration decode together: one batched call per chunk length (the scheduler hands most
sequences out on the same step with the same length, so there are few calls). A sequence's first
frames reset its row, starting a new utterance there.

On CUDA the codec runs on its own CUDA stream, so its convolutions overlap the next decode steps
instead of stalling them, and its audio is copied to pinned host memory; `completed()` hands out
the audio whose copy has landed, oldest first, without waiting. Elsewhere it runs at once.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..model.codec import ModdedDAC
from ..model.codec_stream import StreamingDecoder
from .scheduler import Harvest


@dataclass
class Decoded:
    owner: Any
    audio: np.ndarray  # float32 mono
    frames: int
    final: bool


@dataclass
class _Pending:
    harvests: list[Harvest]
    outputs: list[tuple[list[int], torch.Tensor]]  # (harvest indices, host audio (b, n * frame_length))
    ready: Any  # CUDA event after the copies, or None


class CodecRunner:
    def __init__(self, codec: ModdedDAC, rows: int):
        self.decoder = StreamingDecoder(codec, batch=rows)
        device = next(codec.parameters()).device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._pending: deque[_Pending] = deque()

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    @torch.inference_mode()
    def submit(self, harvests: list[Harvest]) -> None:
        """Start decoding the harvests' frames (their codes are copied now: the slots move on)."""
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, h in enumerate(harvests):
            if h.codes.shape[1]:
                by_length[h.codes.shape[1]].append(i)
        groups = [(indices, torch.stack([harvests[i].codes for i in indices])) for indices in by_length.values()]
        starting = [h.slot for h in harvests if h.first]
        outputs = []
        side = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
        with side:
            if starting:
                self.decoder.reset(starting)
            for indices, codes in groups:
                audio = self.decoder.decode(codes, rows=[harvests[i].slot for i in indices])[:, 0]
                if self.stream is not None:
                    codes.record_stream(self.stream)  # made on the main stream, read here
                    host = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
                    host.copy_(audio, non_blocking=True)
                else:
                    host = audio.cpu()
                outputs.append((indices, host))
            ready = None
            if self.stream is not None:
                ready = torch.cuda.Event()
                ready.record(self.stream)
        self._pending.append(_Pending(harvests, outputs, ready))

    def completed(self, wait: bool = False) -> list[Decoded]:
        """Audio of submitted harvests whose decode has finished, in submission order; wait=True
        blocks for the oldest one if none has finished."""
        done = []
        while self._pending:
            item = self._pending[0]
            if item.ready is not None and not item.ready.query():
                if not (wait and not done):
                    break
                item.ready.synchronize()
            self._pending.popleft()
            audio = [np.zeros(0, dtype=np.float32)] * len(item.harvests)
            for indices, host in item.outputs:
                rows = host.numpy()
                for row, i in enumerate(indices):
                    audio[i] = rows[row].copy()  # not a view of the reused pinned buffer
            done.extend(Decoded(h.owner, a, h.codes.shape[1], h.final) for h, a in zip(item.harvests, audio))
        return done

    def discard(self) -> list[Any]:
        """Forget undelivered work (after a failure); returns its owners."""
        owners = [h.owner for item in self._pending for h in item.harvests]
        self._pending.clear()
        return owners
