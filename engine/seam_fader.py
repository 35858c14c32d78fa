"""Joins a request's text chunks without clicks."""

from __future__ import annotations

import numpy as np

SEAM_FADE_SECONDS = 0.01


class SeamFader:
    """Fades the first and last few milliseconds of a text chunk's audio as it streams past, so
    chunks join without clicks; holds back the last `n` samples until it knows whether they end
    the chunk."""

    def __init__(self, n: int, *, fade_in: bool, fade_out: bool):
        self.n, self.fade_out = n, fade_out
        self._ramp = np.linspace(0.0, 1.0, n, dtype=np.float32)
        self._faded_in = not fade_in
        self._held = np.zeros(0, dtype=np.float32)

    def push(self, audio: np.ndarray) -> np.ndarray:
        audio = np.concatenate([self._held, audio])
        if not self._faded_in and len(audio):
            m = min(self.n, len(audio))
            audio[:m] *= self._ramp[:m]
            self._faded_in = True
        split = max(len(audio) - self.n, 0)
        self._held = audio[split:]
        return audio[:split]

    def finish(self) -> np.ndarray:
        tail, self._held = self._held, np.zeros(0, dtype=np.float32)
        if self.fade_out and len(tail):
            tail = tail * self._ramp[::-1][-len(tail):]
        return tail
