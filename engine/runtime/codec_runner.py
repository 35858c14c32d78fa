"""Harvested frames -> audio, for every running sequence at once.

One streaming codec decoder holds a stream (row) per KV slot. The frames harvested in one
scheduler iteration decode together: one batched call per chunk length (the scheduler hands most
sequences out on the same step with the same length, so there are few calls). A sequence's first
frames reset its row, starting a new utterance there.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from ..model.codec import ModdedDAC
from ..model.codec_stream import StreamingDecoder
from .scheduler import Harvest


class CodecRunner:
    def __init__(self, codec: ModdedDAC, rows: int):
        self.decoder = StreamingDecoder(codec, batch=rows)
        self.samples_per_frame = codec.config.frame_length

    @torch.inference_mode()
    def decode(self, harvests: list[Harvest]) -> list[np.ndarray]:
        """float32 mono audio for each harvest, in order."""
        starting = [h.slot for h in harvests if h.first]
        if starting:
            self.decoder.reset(starting)
        audio = [np.zeros(0, dtype=np.float32)] * len(harvests)
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, h in enumerate(harvests):
            if h.codes.shape[1]:
                by_length[h.codes.shape[1]].append(i)
        for indices in by_length.values():
            codes = torch.stack([harvests[i].codes for i in indices])
            out = self.decoder.decode(codes, rows=[harvests[i].slot for i in indices])[:, 0].cpu().numpy()
            for row, i in enumerate(indices):
                audio[i] = out[row]
        return audio
