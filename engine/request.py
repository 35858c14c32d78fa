"""A synthesis request as the GPU worker receives it, prepared on the caller's thread, and the
audio it sends back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .params import SamplingParams


@dataclass(frozen=True)
class ReferenceClip:
    samples: np.ndarray  # 44.1 kHz mono
    transcript: str
    key: str  # ReferenceCodeCache.key(samples), hashed on the caller's thread, not the GPU worker's


@dataclass
class PreparedRequest:
    chunks: list[str]
    text_parts: list[torch.Tensor]  # each chunk's prompt columns (text_part), built on the caller's thread
    references: list[ReferenceClip]
    params: SamplingParams
    seed: int


@dataclass
class AudioChunk:
    samples: np.ndarray  # float32 mono
    frames: int
    text_chunk: int
