"""Per-request generation parameters, validated at the edge.

Ranges follow the reference API (`ServeTTSRequest` at fish-speech d3df505): temperature and top_p
in [0.1, 1.0], repetition_penalty in [0.9, 2.0]. Defaults are the reference API's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import InputError

# (low, high) inclusive ranges; the UI builds its sliders from these.
TEMPERATURE_RANGE = (0.1, 1.0)
TOP_P_RANGE = (0.1, 1.0)
REPETITION_PENALTY_RANGE = (0.9, 2.0)
MAX_NEW_TOKENS_RANGE = (0, 8192)  # 0 = until the context is full
CHUNK_LENGTH_RANGE = (100, 1000)  # characters of text per generated chunk
SEED_RANGE = (0, 2**31 - 1)


def _check_range(name: str, value, bounds, integer: bool = False):
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be a number, got {value!r}")
    if integer and int(value) != value:
        raise InputError(f"{name} must be a whole number, got {value!r}")
    if not math.isfinite(value) or not (low <= value <= high):
        raise InputError(f"{name} must be between {low} and {high}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    max_new_tokens: int = 1024
    chunk_length: int = 200
    seed: int | None = None

    def __post_init__(self):
        _check_range("temperature", self.temperature, TEMPERATURE_RANGE)
        _check_range("top_p", self.top_p, TOP_P_RANGE)
        _check_range("repetition_penalty", self.repetition_penalty, REPETITION_PENALTY_RANGE)
        _check_range("max_new_tokens", self.max_new_tokens, MAX_NEW_TOKENS_RANGE, integer=True)
        _check_range("chunk_length", self.chunk_length, CHUNK_LENGTH_RANGE, integer=True)
        if self.seed is not None:
            _check_range("seed", self.seed, SEED_RANGE, integer=True)

    def to_dict(self) -> dict:
        return asdict(self)

