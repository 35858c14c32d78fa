"""Checks a reference clip the moment it is uploaded or recorded: is it audio, how long, how loud.

Messages name no server path: the clip is read from its bytes, so the engine's loader calls it
"the uploaded audio".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.audio import SAMPLE_RATE, load_audio
from engine.errors import InputError

# A saved voice needs this much speech to sound like the speaker; the engine's loader accepts less.
MIN_VOICE_SECONDS = 5.0
BEST_SECONDS = "5 to 15 s"
LONG_SECONDS = 30.0  # beyond this every request re-reads a long prompt for little gain
QUIET_RMS_DBFS = -40.0
QUIET_PEAK_DBFS = -20.0
CLIP_LEVEL = 0.98  # samples at or above this are treated as clipped
CLIPPED_SHARE = 0.001  # more than 0.1 % clipped samples is audible distortion


_DECODER_DETAIL = re.compile(r"\s*\([^()]*pipe:[^()]*\)")


@dataclass(frozen=True)
class ClipReport:
    seconds: float = 0.0
    error: str | None = None  # the clip cannot be used at all
    warnings: tuple[str, ...] = ()

    @property
    def too_short(self) -> bool:
        return self.error is None and self.seconds < MIN_VOICE_SECONDS

    def markdown(self) -> str:
        if self.error:
            return f"**Cannot use this clip.** {self.error}"
        if self.warnings:
            return "\n\n".join(f"**Check the clip.** {w}" for w in self.warnings)
        return f"Clip OK: {self.seconds:.1f} s, good level."


def _dbfs(value: float) -> float:
    return -math.inf if value <= 0 else 20 * math.log10(value)


def level_warnings(samples: np.ndarray) -> list[str]:
    """Too quiet or clipped, from mono float samples in [-1, 1]."""
    warnings = []
    peak = float(np.abs(samples).max())
    rms = float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))
    if _dbfs(rms) < QUIET_RMS_DBFS or _dbfs(peak) < QUIET_PEAK_DBFS:
        warnings.append(
            f"Too quiet (peak {_dbfs(peak):.0f} dBFS, average {_dbfs(rms):.0f} dBFS): move closer to the "
            "microphone or raise its gain, then record again."
        )
    clipped = float(np.mean(np.abs(samples) >= CLIP_LEVEL))
    if clipped > CLIPPED_SHARE:
        warnings.append(
            f"Clipped ({clipped:.1%} of samples at full scale): the recording distorts. "
            "Lower the microphone gain or move back a little, then record again."
        )
    return warnings


def check_clip(path: str | None, max_seconds: float | None) -> ClipReport | None:
    """None when there is no clip."""
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
        samples = load_audio(data, max_seconds=max_seconds)
    except InputError as e:
        return ClipReport(error=_sentence(str(e)))
    except OSError:
        return ClipReport(error="The clip could not be read; upload or record it again.")
    seconds = len(samples) / SAMPLE_RATE
    warnings = []
    if seconds < MIN_VOICE_SECONDS:
        warnings.append(
            f"Too short ({seconds:.1f} s): a voice needs at least {MIN_VOICE_SECONDS:g} s of speech "
            f"({BEST_SECONDS} works best). Preview works; saving needs a longer clip."
        )
    elif seconds > LONG_SECONDS:
        warnings.append(
            f"Long clip ({seconds:.0f} s): every request with this voice reads all of it. "
            f"A {BEST_SECONDS} excerpt of clear speech clones as well and is faster."
        )
    return ClipReport(seconds=seconds, warnings=tuple(warnings + level_warnings(samples)))


def _sentence(message: str) -> str:
    message = message.replace("the uploaded audio", "this file", 1)
    message = _DECODER_DETAIL.sub("", message)  # ffmpeg's own words mean nothing to a user
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")
