"""Audio in and out: load reference clips as 44.1 kHz mono float32, encode output for the API.

Reading tries soundfile first (WAV, FLAC, OGG, MP3 in-process) and falls back to ffmpeg (the one
engine/ffmpeg.py finds) for containers libsndfile does not know (m4a, webm from browser recordings,
...). Writing uses soundfile (s1-mini ecosystem notes §7) and needs ffmpeg, through pydub, only where
an old libsndfile lacks MP3/Opus.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Union

import numpy as np
import soundfile as sf
import soxr

from .errors import InputError
from .ffmpeg import FfmpegError, PipedWav, decoded, ffmpeg_available

SAMPLE_RATE = 44100
MIN_SECONDS = 0.5
SILENCE_DBFS = -60.0  # a clip whose peak is below this holds no usable speech
# Studio masters go this high; above it a small compressed file can decode to gigabytes.
MAX_SAMPLE_RATE = 192_000
BLOCK_FRAMES = 1 << 16  # frames read at a time, then mixed to one channel
WHOLE_READ_SAMPLES = 1 << 22  # files of up to this many samples (16 MB in float32) are read at once
# Uploads reach libsndfile as anonymous memory files, by their /proc path (see _readable_by_path).
MEMORY_FILES = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")

AudioSource = Union[bytes, bytearray, memoryview, str, os.PathLike, tuple]

OUTPUT_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
MIME_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",  # raw 16-bit little-endian mono at the engine's sample rate
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",  # ADTS
}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the only rates Opus accepts

_FFMPEG_FORMATS = {"mp3": {"format": "mp3"}, "opus": {"format": "ogg", "codec": "libopus"}, "aac": {"format": "adts"}}


def ffmpeg_missing_message(what: str) -> str:
    return (
        f"{what} needs ffmpeg, which is not installed. Install it (`pip install imageio-ffmpeg`, or Linux: "
        "`apt-get install ffmpeg`, macOS: `brew install ffmpeg`, Windows: `winget install ffmpeg`) "
        "or use WAV or FLAC instead."
    )


# ---- loading -----------------------------------------------------------------------------------


def load_audio(source: AudioSource, *, max_seconds: float | None = None) -> np.ndarray:
    """Mono float32 samples at SAMPLE_RATE from file bytes, a file path, or (sample_rate, array).

    Raises InputError, with what was wrong and what to do, for unreadable, empty, non-finite,
    silent, too short or (when max_seconds is given) too long audio.
    """
    label = _describe(source)
    if isinstance(source, tuple):
        frames, rate = _from_array(source, label)
    else:
        frames, rate = _decode(source, label, max_seconds)
    return _to_engine_samples(frames, rate, label, max_seconds)


def _describe(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return f"audio file '{Path(source).name}'"
    if isinstance(source, tuple):
        return "the audio array"
    return "the uploaded audio"


def _from_array(source: tuple, label: str) -> tuple[np.ndarray, int]:
    """(sample_rate, samples) as Gradio gives it: int or float samples, shape (n,) or (n, channels)."""
    if len(source) != 2:
        raise InputError(f"{label} must be a (sample_rate, samples) pair")
    rate, samples = source
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise InputError(f"{label}: the sample rate must be a positive integer, got {rate!r}")
    samples = np.asarray(samples)
    if samples.dtype == np.uint8:  # 8-bit PCM is unsigned
        frames = (samples.astype(np.float32) - 128.0) / 128.0
    elif np.issubdtype(samples.dtype, np.signedinteger):
        frames = samples.astype(np.float32) / float(2 ** (8 * samples.dtype.itemsize - 1))
    elif np.issubdtype(samples.dtype, np.floating):
        frames = samples.astype(np.float32)
    else:
        raise InputError(f"{label} must hold integer or float samples, got {samples.dtype}")
    if frames.ndim == 1:
        frames = frames[:, None]
    elif frames.ndim == 2 and frames.shape[1] > 8 and frames.shape[0] <= 8:
        frames = frames.T  # (channels, n) from a non-Gradio caller
    elif frames.ndim != 2 or frames.shape[1] > 8:
        raise InputError(f"{label} must have shape (samples,) or (samples, channels), got {samples.shape}")
    return frames, int(rate)


def _decode(source, label: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:  # one look at the file: it may go (a saved voice deleted) between two
            status = path.stat()
        except OSError:
            status = None
        if status is None or not stat.S_ISREG(status.st_mode):
            raise InputError(f"{label} was not found at {path} (or is not a file); check the path")
        if status.st_size == 0:
            raise InputError(f"{label} is empty (0 bytes); record or upload the clip again")
        decoded = _decode_soundfile(str(path), label, max_seconds)
        return decoded if decoded is not None else _decode_ffmpeg(str(path), label, max_seconds)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise InputError(f"{label} is empty (0 bytes); record or upload the clip again")
        with _readable_by_path(data) as handle:
            decoded = _decode_soundfile(handle, label, max_seconds)
        return decoded if decoded is not None else _decode_ffmpeg(data, label, max_seconds)
    raise InputError(
        f"audio must be file bytes, a file path or a (sample_rate, samples) pair, got {type(source).__name__}"
    )


@contextlib.contextmanager
def _readable_by_path(data: bytes) -> Iterator[str | io.BytesIO]:
    """The bytes as libsndfile reads them fastest beside busy Python threads: on Linux the path of an
    anonymous memory file, which it reads in C; elsewhere (or where /proc is missing) a file object.
    From a file object libsndfile calls back into Python for every 8 KB it reads, and each call
    waits for the GIL: beside a thread running Python without pause, as the GPU worker does under
    load, a 10 s WAV took ~430 ms to decode and hash that way and ~55 ms by path, ~2 ms without that
    thread (tools/profile_clip_prepare.py)."""
    fd = None
    if MEMORY_FILES:
        try:
            fd = os.memfd_create("s1-mini-upload")
        except OSError:
            pass
    if fd is None:
        yield io.BytesIO(data)
        return
    try:
        with open(fd, "wb", closefd=False) as memory_file:
            memory_file.write(data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _decode_soundfile(handle, label: str, max_seconds: float | None) -> tuple[np.ndarray, int] | None:
    """Frames and rate, or None when libsndfile does not recognise the data."""
    try:
        with sf.SoundFile(handle) as audio:
            # Check the length before decoding so an hour-long upload is refused cheaply.
            if max_seconds is not None and audio.frames > 0:
                _check_not_too_long(audio.frames / audio.samplerate, label, max_seconds)
            return _read_mono(audio, label), audio.samplerate
    except RuntimeError:  # LibsndfileError: a format libsndfile does not know, or broken data
        return None


def _decode_ffmpeg(source: str | bytes, label: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    if not ffmpeg_available():
        raise InputError(
            f"{label} is not WAV, FLAC, OGG or MP3, and "
            + ffmpeg_missing_message("reading other formats (m4a, webm, ...)")
        )
    # Decode one second past the limit at most: enough to tell that the clip is too long.
    duration = None if max_seconds is None else max_seconds + 1.0
    try:
        with decoded(source, duration) as audio:
            return _read_mono(audio, label), audio.samplerate
    except FfmpegError as exc:
        raise InputError(
            f"cannot read {label}: it is corrupt or not an audio file ({exc}). Use WAV, FLAC, MP3, OGG, M4A or WEBM."
        ) from None


def _read_mono(audio: sf.SoundFile | PipedWav, label: str) -> np.ndarray:
    """The file's frames mixed to one channel, (n, 1), a block at a time: a file of many channels
    never needs them all in memory at once. Mixed as _to_engine_samples mixes, row by row. A file
    that libsndfile reads and that holds at most WHOLE_READ_SAMPLES is read in one call: every call
    lets go of the GIL and waits to take it back (see _readable_by_path)."""
    _check_sample_rate(audio.samplerate, label)
    if isinstance(audio, sf.SoundFile) and 0 < audio.frames * audio.channels <= WHOLE_READ_SAMPLES:
        return _mixed(audio.read(dtype="float32", always_2d=True))[:, None]
    mixed = [_mixed(block) for block in audio.blocks(BLOCK_FRAMES, dtype="float32", always_2d=True)]
    return (np.concatenate(mixed) if mixed else np.zeros(0, np.float32))[:, None]


def _mixed(frames: np.ndarray) -> np.ndarray:
    """(n, channels) -> (n,) float32, the channels' mean (one channel: itself, without a pass when it
    is float32 already)."""
    if frames.shape[1] == 1:
        return frames[:, 0].astype(np.float32, copy=False)
    return frames.mean(axis=1, dtype=np.float32)


def _check_sample_rate(rate: int, label: str) -> None:
    if rate > MAX_SAMPLE_RATE:
        raise InputError(f"{label} has a sample rate of {rate} Hz, above {MAX_SAMPLE_RATE} Hz; "
                         "export it at 48 or 44.1 kHz")


def _to_engine_samples(frames: np.ndarray, rate: int, label: str, max_seconds: float | None) -> np.ndarray:
    """Validated (n, channels) frames at `rate` -> mono float32 at SAMPLE_RATE."""
    _check_sample_rate(rate, label)
    if frames.shape[0] == 0:
        raise InputError(f"{label} holds no audio samples; record or upload the clip again")
    # Few passes over the samples: each numpy pass lets go of the GIL and waits to take it back,
    # which beside busy Python threads (the GPU worker under load) costs up to a switch interval.
    mono = _mixed(frames)
    peak = float(np.abs(mono).max())  # NaN and infinities in any channel reach the peak through the mix
    if not math.isfinite(peak):
        raise InputError(f"{label} contains NaN or infinite sample values; re-export it as a normal WAV file")
    seconds = mono.shape[0] / rate
    if max_seconds is not None:
        _check_not_too_long(seconds, label, max_seconds)
    if seconds < MIN_SECONDS:
        raise InputError(
            f"{label} is only {seconds:.2f} s long; use at least {MIN_SECONDS} s of clear speech "
            "(5 to 15 s works best)"
        )
    if peak < 10 ** (SILENCE_DBFS / 20):
        level = "-inf" if peak == 0 else f"{20 * math.log10(peak):.0f}"
        raise InputError(
            f"{label} is silent (peak level {level} dBFS, below {SILENCE_DBFS:.0f} dBFS); "
            "check that the microphone was on and the recording has speech"
        )
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def _check_not_too_long(seconds: float, label: str, max_seconds: float):
    if seconds > max_seconds:
        raise InputError(
            f"{label} is {seconds:.1f} s long; the limit is {max_seconds:g} s. "
            "Trim it to a shorter clip of clear speech (5 to 15 s works best)"
        )


def guess_audio_extension(data: bytes) -> str | None:
    """File extension (without dot) of audio file bytes from their magic numbers, or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    if data[4:8] == b"ftyp":
        return "m4a"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    return None


# ---- writing -----------------------------------------------------------------------------------


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] as int16, clipped (a peak above full scale must not wrap around)."""
    # In place after the first pass: a server converts every streamed chunk (np.nan_to_num, which
    # this replaces, took 2.5x as long; NaN still becomes 0 and +-inf full scale).
    scaled = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    scaled *= 32767.0
    np.rint(scaled, out=scaled)
    np.copyto(scaled, 0.0, where=np.isnan(scaled))
    return scaled.astype(np.int16)


def to_pcm16_bytes(chunk: np.ndarray) -> bytes:
    """Raw 16-bit little-endian PCM of a float chunk: the body of a streamed WAV or `pcm` output."""
    return to_int16(chunk).astype("<i2", copy=False).tobytes()


def wav_stream_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """44-byte mono 16-bit WAV header for a stream of unknown length.

    The size fields are 0xFFFFFFFF, the usual "unknown length" value: ffmpeg and browsers then read
    to the end of the stream, and libsndfile reads it too (it reads nothing when they are 0).
    """
    unknown = 0xFFFFFFFF
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", unknown, b"WAVE",
        b"fmt ", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16,
        b"data", unknown,
    )  # fmt: skip


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Whole-file bytes of mono float samples in `fmt` (one of OUTPUT_FORMATS)."""
    fmt = fmt.lower()
    if fmt not in OUTPUT_FORMATS:
        raise InputError(f"unknown audio format {fmt!r}; choose one of {', '.join(OUTPUT_FORMATS)}")
    pcm = to_int16(samples)
    if fmt == "pcm":
        return pcm.astype("<i2").tobytes()
    if fmt in ("wav", "flac"):
        return _soundfile_bytes(pcm, sample_rate, fmt.upper(), "PCM_16")
    if fmt == "aac":  # libsndfile has no AAC
        return _ffmpeg_bytes(pcm, sample_rate, fmt)
    floats = pcm.astype(np.float32) / 32767.0  # the clipped signal, so all formats agree
    if fmt == "opus" and sample_rate not in OPUS_RATES:
        floats = soxr.resample(floats, sample_rate, 48000, quality="HQ")
        sample_rate = 48000
    container, subtype = ("MP3", "MPEG_LAYER_III") if fmt == "mp3" else ("OGG", "OPUS")
    if _soundfile_can_write(container, subtype):
        return _soundfile_bytes(floats, sample_rate, container, subtype)
    return _ffmpeg_bytes(to_int16(floats), sample_rate, fmt)


def _soundfile_can_write(container: str, subtype: str) -> bool:
    return subtype in sf.available_subtypes(container)


def _soundfile_bytes(samples: np.ndarray, sample_rate: int, container: str, subtype: str) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()


def _ffmpeg_bytes(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode with ffmpeg through pydub: for libsndfile builds without MP3 or Opus."""
    if not ffmpeg_available():
        raise InputError(ffmpeg_missing_message(f"{fmt} output with this libsndfile build"))
    from pydub import AudioSegment

    segment = AudioSegment(pcm.astype("<i2").tobytes(), frame_rate=sample_rate, sample_width=2, channels=1)
    buffer = io.BytesIO()
    segment.export(buffer, **_FFMPEG_FORMATS[fmt])
    return buffer.getvalue()
