"""Helpers for the app's end-to-end tests: start `launch.py --demo` for real, decode audio back.

Imported by tests/test_app_*.py and tests/browser/; it holds no tests itself.
"""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_RATE = 44100
SAMPLES_PER_FRAME = 2048  # codec hop: one generated frame is 2048 samples at 44.1 kHz
START_TIMEOUT_S = 120

# Small requests keep the CPU demo model quick: 16 frames = 0.74 s of audio.
FAST = {"max_new_tokens": 16, "seed": 7}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DemoServer:
    """`python launch.py --demo` on a free loopback port, with its own voices and cache dirs."""

    start_timeout_s = START_TIMEOUT_S
    stop_timeout_s = 15

    def __init__(self, tmp_dir: Path, *extra_args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_dir / "server.log"
        self.env = {
            **os.environ,
            "S1_MINI_VOICES_DIR": str(tmp_dir / "voices"),
            "S1_MINI_CACHE_DIR": str(tmp_dir / "cache"),
            "GRADIO_TEMP_DIR": str(tmp_dir / "gradio"),
            "HF_HUB_OFFLINE": "1",
            **(env or {}),
        }
        self.args = [sys.executable, "launch.py", "--demo", "--listen", f"127.0.0.1:{self.port}", *extra_args]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "DemoServer":
        self._log = open(self.log_path, "wb")
        # A session of its own: whatever the server starts (a Ray cluster's processes) goes with it.
        self.process = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"launch.py exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"launch.py did not answer within {self.start_timeout_s} s:\n{self.log_tail()}")

    def __exit__(self, *exc):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # anything of its session still running
            except (ProcessLookupError, PermissionError):
                pass
        self._log.close()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def error_message(response: httpx.Response) -> str:
    """The message of a JSON error: `message`, or `error.message` on the OpenAI route."""
    body = response.json()
    return body["error"]["message"] if isinstance(body.get("error"), dict) else body["message"]


# ---- metrics ------------------------------------------------------------------------------------


def metric_value(metrics: str, name: str, labels: str = "") -> float:
    """The value of one sample in /metrics' text: `name` with exactly `labels` ('{kind="client"}',
    or '' for none)."""
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", metrics, re.M)
    assert match, f"{name}{labels} missing from /metrics"
    return float(match.group(1))


def requests_in_engine(metrics: str) -> float:
    """The requests the engine holds, from /metrics' text: those waiting and those decoding. Both:
    between two text chunks of a request none of its sequences decodes while the next one waits to
    be admitted."""
    return sum(metric_value(metrics, f"s1mini_requests_{state}") for state in ("waiting", "running"))


# ---- audio --------------------------------------------------------------------------------------


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float samples and rate of WAV, FLAC, MP3 or Ogg/Opus bytes (libsndfile reads all four)."""
    samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return samples.mean(axis=1), rate


def decode_pcm16(data: bytes) -> np.ndarray:
    assert len(data) % 2 == 0, "raw PCM must be whole 16-bit samples"
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def assert_audible(samples: np.ndarray, min_seconds: float, rate: int):
    # In whole samples: audio resampled to another rate holds min_seconds rounded down (one frame,
    # 2048 samples at 44.1 kHz, is 2229 at Opus's 48 kHz: 2.4 us short of the frame's time).
    assert len(samples) >= int(min_seconds * rate), f"only {len(samples) / rate:.4f} s of audio"
    rms = float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))
    assert rms > 1e-3, f"audio is silent (rms {rms:.2e})"


# The random demo model may end a sentence after any frame: ask for one frame's worth at least.
ONE_FRAME_S = SAMPLES_PER_FRAME / SAMPLE_RATE


def assert_audio(data: bytes, rate: int = SAMPLE_RATE, min_seconds: float = ONE_FRAME_S) -> np.ndarray:
    """Decodes `data`, checks its sample rate, length and loudness; returns the samples."""
    samples, got_rate = decode(data)
    assert got_rate == rate, f"sample rate {got_rate}, expected {rate}"
    assert_audible(samples, min_seconds, rate)
    return samples


def reference_clip_wav(seconds: float = 2.0, rate: int = 22050) -> bytes:
    """A clip the reference loader accepts (long enough, not silent): a gliding tone with noise."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    tone = 0.3 * np.sin(2 * np.pi * (180 + 60 * t) * t) + 0.02 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    sf.write(buffer, tone.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()
