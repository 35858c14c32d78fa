"""Real speech clips for the audio tests, made at test time with espeak-ng, sox and ffmpeg.

`SpeechClips(folder)` synthesises one sentence with espeak-ng (22.05 kHz mono WAV) and converts it
into the variants the loader must handle. A test asking for a variant whose tool is missing is
skipped with the reason; CI installs all three tools.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SPEECH_TEXT = "The quick brown fox jumps over the lazy dog. This is a short reference clip."
INSTALL_HINT = "apt-get install espeak-ng sox ffmpeg"

# variant -> (file name, tool, arguments after the tool name; {src} and {dst} are filled in)
_VARIANTS = {
    "flac": ("speech.flac", "sox", ["{src}", "{dst}"]),
    "ogg": ("speech.ogg", "sox", ["{src}", "{dst}"]),
    "wav_48k": ("speech_48k.wav", "sox", ["{src}", "-r", "48000", "{dst}"]),
    "stereo": ("speech_stereo.wav", "sox", ["{src}", "-c", "2", "{dst}"]),
    "mp3": ("speech.mp3", "ffmpeg", ["-loglevel", "error", "-i", "{src}", "{dst}"]),
    "m4a": ("speech.m4a", "ffmpeg", ["-loglevel", "error", "-i", "{src}", "-c:a", "aac", "{dst}"]),
    "webm": ("speech.webm", "ffmpeg", ["-loglevel", "error", "-i", "{src}", "-c:a", "libopus", "{dst}"]),
}
VARIANTS = tuple(_VARIANTS)


def _missing(*tools: str) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None]


class SpeechClips:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._made: dict[str, Path] = {}

    def wav(self) -> Path:
        """The espeak-ng original: 22.05 kHz mono 16-bit WAV, about 4 s of speech."""
        return self._make("wav", "speech.wav", "espeak-ng", ["-w", "{dst}", SPEECH_TEXT])

    def variant(self, name: str) -> Path:
        file_name, tool, arguments = _VARIANTS[name]
        source = self.wav()
        return self._make(name, file_name, tool, arguments, source)

    def _make(self, name: str, file_name: str, tool: str, arguments: list[str], source: Path | None = None) -> Path:
        if name not in self._made:
            missing = _missing(tool)
            if missing:
                pytest.skip(f"needs {', '.join(missing)} to make test speech ({INSTALL_HINT})")
            target = self.folder / file_name
            command = [tool] + [arg.format(src=source, dst=target) for arg in arguments]
            subprocess.run(command, check=True, capture_output=True, timeout=60)
            self._made[name] = target
        return self._made[name]
