"""Output audio as asked: speed, volume, sample rate and format, whole or chunk by chunk as produced.

Sample rate and volume are applied in-process (soxr's streaming resampler, a gain). Speed is a
pitch-preserving time-stretch by ffmpeg's `atempo` filter (WSOLA), chained where one filter's range
(0.5-2.0 in older ffmpeg builds) is not enough. Compressed formats (mp3, opus, aac, flac) are
encoded by one ffmpeg process (engine/ffmpeg.py finds it) per stream that reads 16-bit PCM on stdin and writes each packet to
stdout as soon as it is encoded; WAV and raw PCM at speed 1 need no ffmpeg.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import soxr

from .audio import OPUS_RATES, encode_audio, ffmpeg_missing_message, to_int16, to_pcm16_bytes, wav_stream_header
from .errors import InputError
from .ffmpeg import ffmpeg

STREAM_FORMATS = ("wav", "pcm", "mp3", "opus", "aac", "flac")
SPEED_RANGE = (0.25, 4.0)
SAMPLE_RATE_RANGE = (8000, 48000)
VOLUME_DB_RANGE = (-20.0, 20.0)
_ATEMPO_RANGE = (0.5, 2.0)  # what every ffmpeg's atempo takes; newer ones take up to 100
_READ_BYTES = 1 << 16

# ffmpeg output options per format: containers that can be written to a pipe as packets come.
_ENCODERS = {
    "mp3": ["-c:a", "libmp3lame", "-b:a", "128k", "-f", "mp3"],
    "opus": ["-c:a", "libopus", "-b:a", "64k", "-f", "ogg", "-page_duration", "20000"],  # 20 ms pages, not 1 s
    "aac": ["-c:a", "aac", "-b:a", "128k", "-f", "adts"],  # ADTS: AAC frames with their own headers, no index
    "flac": ["-c:a", "flac", "-f", "flac"],
    "pcm": ["-f", "s16le"],
    "wav": ["-f", "s16le"],  # the WAV header is written here, as for unstretched streams
}


@dataclass(frozen=True)
class OutputSpec:
    """What the client asked for. sample_rate None: the engine's own rate (48 kHz for Opus, which
    accepts only 8, 12, 16, 24 and 48 kHz)."""

    format: str = "wav"
    sample_rate: int | None = None
    speed: float = 1.0
    volume_db: float = 0.0

    def __post_init__(self):
        if self.format not in STREAM_FORMATS:
            raise InputError(f"unknown audio format {self.format!r}; choose one of {', '.join(STREAM_FORMATS)}")
        _check("speed", self.speed, SPEED_RANGE)
        _check("volume", self.volume_db, VOLUME_DB_RANGE)
        if self.sample_rate is not None:
            _check("sample_rate", self.sample_rate, SAMPLE_RATE_RANGE)
            if self.format == "opus" and self.sample_rate not in OPUS_RATES:
                raise InputError(f"opus takes the sample rates {', '.join(map(str, OPUS_RATES))}; "
                                 f"got {self.sample_rate}")

    def rate(self, source_rate: int) -> int:
        if self.sample_rate is not None:
            return self.sample_rate
        return 48000 if self.format == "opus" and source_rate not in OPUS_RATES else source_rate

    @property
    def needs_ffmpeg(self) -> bool:
        return self.speed != 1.0 or self.format not in ("wav", "pcm")


def _check(name: str, value, bounds):
    low, high = bounds
    if not math.isfinite(value) or not low <= value <= high:
        raise InputError(f"{name} must be between {low:g} and {high:g}, got {value!r}")


def atempo_chain(speed: float) -> str:
    """ffmpeg filters whose product is `speed`, each within what every atempo takes."""
    factors, rest = [], speed
    while rest > _ATEMPO_RANGE[1]:
        factors.append(_ATEMPO_RANGE[1])
        rest /= _ATEMPO_RANGE[1]
    while rest < _ATEMPO_RANGE[0]:
        factors.append(_ATEMPO_RANGE[0])
        rest /= _ATEMPO_RANGE[0]
    factors.append(rest)
    return ",".join(f"atempo={f:.6g}" for f in factors)


def ffmpeg_path() -> str:
    found = ffmpeg()
    if found is None:
        raise InputError(ffmpeg_missing_message("this output (speed other than 1, or mp3, opus, aac and flac streams)"))
    return found.path


def _ffmpeg_command(rate: int, spec: OutputSpec) -> list[str]:
    command = [ffmpeg_path(), "-hide_banner", "-nostdin", "-loglevel", "error",
               # raw input of a known layout: nothing to probe, so the first packet is not held back
               "-probesize", "32", "-analyzeduration", "0",
               "-f", "s16le", "-ar", str(rate), "-ac", "1", "-i", "pipe:0"]
    if spec.speed != 1.0:
        command += ["-af", atempo_chain(spec.speed)]
    return command + ["-ar", str(rate), *_ENCODERS[spec.format], "-flush_packets", "1", "pipe:1"]


class _Shaper:
    """Gain and resampling, chunk by chunk (soxr keeps its filter state between chunks)."""

    def __init__(self, source_rate: int, spec: OutputSpec):
        self.gain = 10 ** (spec.volume_db / 20)
        rate = spec.rate(source_rate)
        self.resampler = None if rate == source_rate else soxr.ResampleStream(source_rate, rate, 1, dtype="float32",
                                                                                  quality="HQ")

    def push(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        samples = np.asarray(samples, dtype=np.float32)
        if self.gain != 1.0:
            samples = samples * np.float32(self.gain)
        if self.resampler is not None:
            samples = self.resampler.resample_chunk(samples, last=last)
        return samples


def encode_stream(chunks: Iterator[np.ndarray], source_rate: int, spec: OutputSpec) -> Iterator[bytes]:
    """Bytes of `spec.format` as `chunks` (float32 mono at source_rate) arrive. Nothing is yielded
    before the first chunk, so an error the source raises before any audio comes out of the first
    next() (an HTTP edge can still answer it with a 4xx). Closing the returned generator closes
    `chunks` (for the engine, that cancels the request)."""
    chunks = iter(chunks)
    try:
        first = next(chunks, None)
    except BaseException:
        _close(chunks)
        raise
    encoder = _ffmpeg_stream if spec.needs_ffmpeg else _pcm_stream
    yield from encoder([] if first is None else [first], chunks, source_rate, spec)


def _pcm_stream(first: list, chunks, source_rate: int, spec: OutputSpec) -> Iterator[bytes]:
    shaper = _Shaper(source_rate, spec)
    header = wav_stream_header(spec.rate(source_rate)) if spec.format == "wav" else b""
    try:
        for chunk in itertools.chain(first, chunks):
            out = shaper.push(chunk)
            if len(out):
                yield header + to_pcm16_bytes(out)
                header = b""
        tail = shaper.push(np.zeros(0, np.float32), last=True)
        if len(tail) or header:
            yield header + to_pcm16_bytes(tail)
    finally:
        _close(chunks)


def _ffmpeg_stream(first: list, chunks, source_rate: int, spec: OutputSpec) -> Iterator[bytes]:
    """The feeder thread reads `chunks` and closes it: a generator cannot be closed from another
    thread while it runs."""
    rate = spec.rate(source_rate)
    process = subprocess.Popen(_ffmpeg_command(rate, spec), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    failure: list[BaseException] = []

    def feed():
        """On its own thread, so that ffmpeg's output is read while the engine is still producing."""
        shaper = _Shaper(source_rate, spec)
        try:
            for chunk in itertools.chain(first, chunks):
                process.stdin.write(to_pcm16_bytes(shaper.push(chunk)))
                process.stdin.flush()
            process.stdin.write(to_pcm16_bytes(shaper.push(np.zeros(0, np.float32), last=True)))
        except (BrokenPipeError, ValueError, OSError):
            pass  # ffmpeg was stopped: the reader went away
        except BaseException as exc:  # the engine's error: handed to the reader
            failure.append(exc)
        finally:
            _close(chunks)
            try:
                process.stdin.close()
            except OSError:
                pass

    feeder = threading.Thread(target=feed, name="audio-encode-feed", daemon=True)
    feeder.start()
    finished = False
    try:
        header = wav_stream_header(rate) if spec.format == "wav" else b""
        while data := os.read(process.stdout.fileno(), _READ_BYTES):
            yield header + data
            header = b""
        feeder.join()
        if failure:
            raise failure[0]
        if process.wait() != 0:
            message = process.stderr.read().decode(errors="replace")[-300:]
            raise RuntimeError(f"ffmpeg failed encoding {spec.format}: {message}")
        finished = True
    finally:
        if not finished:
            process.kill()  # the feeder's next write fails, and it closes the engine's stream
        process.wait()
        process.stdout.close()
        process.stderr.close()


def encode_whole(samples: np.ndarray, source_rate: int, spec: OutputSpec) -> tuple[bytes, int]:
    """A complete file of `spec.format` (length fields filled in); returns it and its sample rate."""
    rate = spec.rate(source_rate)
    shaped = _Shaper(source_rate, spec).push(samples, last=True)
    if spec.speed != 1.0:
        shaped = stretch(shaped, rate, spec.speed)
    return encode_audio(shaped, rate, spec.format), rate


def stretch(samples: np.ndarray, rate: int, speed: float) -> np.ndarray:
    """Whole float32 samples played `speed` times as fast, pitch kept."""
    result = subprocess.run(_ffmpeg_command(rate, OutputSpec("pcm", speed=speed)), input=to_int16(samples).tobytes(),
                            capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ffmpeg failed stretching audio: {result.stderr.decode(errors='replace')[-300:]}")
    return np.frombuffer(result.stdout, dtype="<i2").astype(np.float32) / 32767.0


def _close(chunks):
    close = getattr(chunks, "close", None)
    if close is not None:
        close()
