"""The one place that finds the ffmpeg program: audio decoding and encoding (engine/audio.py, pydub)
and the UI's streaming playback (Gradio) all run the binary chosen here.

PATH's ffmpeg comes first (the OS package: the user's choice, updated with the system). Without one,
the binary that the imageio-ffmpeg wheel ships serves, so a plain `pip install` streams and writes
every format on Linux, macOS and Windows. Gradio and pydub start `ffmpeg` by name, so the wheel's
binary is linked as `ffmpeg` into a directory put at the front of this process's PATH (children
inherit it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from loguru import logger

WHEEL = "the imageio-ffmpeg wheel"
_EXE = "ffmpeg.exe" if os.name == "nt" else "ffmpeg"


@dataclass(frozen=True)
class Ffmpeg:
    path: str  # the binary itself
    source: str  # "PATH" or WHEEL


class FfmpegError(RuntimeError):
    """ffmpeg ran and failed; the message is the last line it printed (what it could not read)."""


def find_ffmpeg(search_path: str | None = None) -> Ffmpeg | None:
    """PATH's ffmpeg, else the wheel's, else None. Finds only: changes nothing."""
    on_path = shutil.which("ffmpeg", path=search_path)
    if on_path:
        return Ffmpeg(on_path, "PATH")
    try:
        import imageio_ffmpeg

        return Ffmpeg(imageio_ffmpeg.get_ffmpeg_exe(), WHEEL)
    except (ImportError, RuntimeError):  # not installed, or no binary for this platform
        return None


_lock = threading.Lock()
_chosen: list[Ffmpeg | None] = []  # filled once per process


def ffmpeg() -> Ffmpeg | None:
    """The ffmpeg this process uses, reachable as `ffmpeg` on PATH; None when there is none.
    The first call logs which one."""
    with _lock:
        if not _chosen:
            found = find_ffmpeg()
            if found is None:
                logger.warning(
                    "no ffmpeg: not on PATH and the imageio-ffmpeg wheel is not installed. The UI plays audio when "
                    "it is complete instead of streaming it, and m4a/webm uploads cannot be read "
                    "(pip install imageio-ffmpeg, or install ffmpeg from the OS's packages)"
                )
            elif found.source == WHEEL:
                _put_on_path(found.path)
                logger.info("ffmpeg: {} (from {}; none on PATH)", found.path, WHEEL)
            else:
                logger.info("ffmpeg: {} (from PATH)", found.path)
            _chosen.append(found)
        return _chosen[0]


def ffmpeg_available() -> bool:
    return ffmpeg() is not None


def _put_on_path(binary: str) -> None:
    folder = _link_folder()
    link = folder / _EXE
    if not _current(link, binary):
        staged = folder / f".{_EXE}.{os.getpid()}"
        try:
            staged.unlink(missing_ok=True)
            _link_or_copy(binary, staged)
            os.replace(staged, link)  # atomic: another process starting at once sees one or the other
        except OSError as exc:
            # Windows refuses to replace a program that runs: another instance is using the copy.
            staged.unlink(missing_ok=True)
            if not link.exists():
                folder = _private_folder()
                _link_or_copy(binary, folder / _EXE)
            else:
                logger.warning("could not update {} ({}); using it as it is", link, exc.strerror or exc)
    os.environ["PATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PATH")]))


def _link_folder() -> Path:
    """A folder of this user's, not a shared temp path another user could plant a program in."""
    from platformdirs import user_cache_dir

    try:
        folder = Path(user_cache_dir("s1-mini-studio")) / "ffmpeg-bin"
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
        return folder
    except OSError:  # read-only home (some containers)
        return _private_folder()


def _private_folder() -> Path:
    """A new folder of this process's, for the link when the user's cache folder cannot hold it."""
    return Path(tempfile.mkdtemp(prefix="s1-mini-ffmpeg-"))


def _current(link: Path, binary: str) -> bool:
    """Whether `link` is `binary`: a link to it, or a copy of it (copy2 keeps the time)."""
    try:
        if os.path.samefile(link, binary):
            return True
        ours, theirs = link.stat(), os.stat(binary)
    except OSError:
        return False
    return ours.st_size == theirs.st_size and ours.st_mtime_ns == theirs.st_mtime_ns


def _link_or_copy(binary: str, target: Path) -> None:
    # Windows allows symlinks only to administrators or in developer mode; a hard link needs the
    # same volume; a copy always works.
    for make in (os.symlink, os.link):
        try:
            make(binary, target)
            return
        except OSError:
            continue
    shutil.copy2(binary, target)


@contextlib.contextmanager
def decoded(source: str | bytes, max_seconds: float | None = None) -> Iterator["PipedWav"]:
    """Any container and codec ffmpeg knows (m4a, webm, ...) decoding as it is read: a PipedWav of its
    32-bit float samples, at most `max_seconds` long, that holds one block at a time (a file of many
    channels at a high rate is never decoded whole in memory). ffmpeg stops when the block reading
    ends early. No ffprobe needed: the wheel ships ffmpeg alone."""
    found = ffmpeg()
    if found is None:
        raise FfmpegError("ffmpeg is not installed")
    # Fed through a pipe, and ffmpeg may open nothing else: a playlist (HLS, concat) in an upload would
    # otherwise make it fetch the URLs or read the server files it names. cache: lets it seek back in
    # the pipe (MP4 files keep their index at the end).
    try:
        data = bytes(source) if isinstance(source, (bytes, bytearray, memoryview)) else Path(source).read_bytes()
    except OSError as exc:  # gone meanwhile (a saved voice deleted): no server path in the message
        raise FfmpegError(f"the input could not be read ({exc.strerror or 'I/O error'})") from None
    limit = [] if max_seconds is None else ["-t", f"{max_seconds:.3f}"]
    command = [found.path, "-v", "error", "-nostdin", "-protocol_whitelist", "cache,pipe", "-i", _INPUT, "-vn", *limit,
               "-c:a", "pcm_f32le", "-f", "wav", "pipe:1"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    errors = bytearray()
    # stdin is written and stderr read on threads of their own, so that neither pipe can fill and stall
    # ffmpeg while this thread reads stdout.
    helpers = [threading.Thread(target=_feed, args=(process.stdin, data), daemon=True),
               threading.Thread(target=_drain, args=(process.stderr, errors), daemon=True)]
    for helper in helpers:
        helper.start()
    try:
        yield PipedWav(process, errors, helpers[1])
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for helper in helpers:
            helper.join()
        process.stdout.close()


_INPUT = "cache:pipe:0"


class PipedWav:
    """ffmpeg's float WAV output read from its pipe: `samplerate`, `channels` and `blocks()` as
    soundfile.SoundFile has them. Raises FfmpegError with ffmpeg's reason when it fails."""

    def __init__(self, process: subprocess.Popen, errors: bytearray, draining: threading.Thread):
        self._process, self._errors, self._draining = process, errors, draining
        self.channels, self.samplerate = self._header()

    def blocks(self, blocksize: int, dtype: str = "float32", always_2d: bool = True) -> Iterator[np.ndarray]:
        """(n, channels) float32 blocks of up to `blocksize` frames, in order."""
        if dtype != "float32" or not always_2d:
            raise ValueError("ffmpeg's samples come as 2-D float32 blocks")
        frame_bytes = 4 * self.channels
        while True:
            data = self._read(blocksize * frame_bytes)
            frames = len(data) // frame_bytes
            if frames:  # a trailing partial frame (a cut-off output) is dropped
                yield np.frombuffer(data, "<f4", frames * self.channels).reshape(frames, self.channels)
            if len(data) < blocksize * frame_bytes:
                self._check_exit()
                return

    def _header(self) -> tuple[int, int]:
        """(channels, rate) from the RIFF header, up to the data chunk (whose size ffmpeg leaves unknown
        on a pipe)."""
        riff = self._read(12)
        if len(riff) < 12:
            self._check_exit()
        if riff[:4] not in (b"RIFF", b"RF64") or riff[8:12] != b"WAVE":
            raise FfmpegError("ffmpeg wrote no WAV header")
        fmt = None
        while True:
            chunk = self._read(8)
            if len(chunk) < 8:
                self._check_exit()
                raise FfmpegError("ffmpeg's output ended before its samples")
            kind, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if kind == b"data":
                break
            if size > _MAX_HEADER_CHUNK:
                raise FfmpegError(f"ffmpeg wrote a WAV header chunk of {size} bytes")
            body = self._read(size + size % 2)  # chunks are padded to an even size
            if kind == b"fmt ":
                fmt = body
        if fmt is None or len(fmt) < 16:
            raise FfmpegError("ffmpeg's WAV header has no format chunk")
        tag, channels, rate = struct.unpack("<HHI", fmt[:8])
        bits = struct.unpack("<H", fmt[14:16])[0]
        if tag not in (_FLOAT, _EXTENSIBLE) or bits != 32 or channels == 0:
            raise FfmpegError(f"ffmpeg wrote WAV format {tag} of {bits}-bit samples, not 32-bit float")
        return channels, rate

    def _read(self, size: int) -> bytes:
        """Up to `size` bytes: fewer only at the end of the output."""
        parts, got = [], 0
        while got < size:
            part = self._process.stdout.read(size - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _check_exit(self) -> None:
        """At the end of the output: raise FfmpegError, with its reason, if ffmpeg failed."""
        code = self._process.wait()
        if code != 0:
            self._draining.join()  # ffmpeg's last words may still be in the pipe
            lines = self._errors.decode(errors="replace").strip().splitlines()
            # ffmpeg names the input first ("cache:pipe:0: ..."): said as "the input"
            reason = lines[-1].replace(f"{_INPUT}: ", "").replace(_INPUT, "the input") if lines else ""
            raise FfmpegError(reason[:200] or f"ffmpeg exited with {code}")


_FLOAT, _EXTENSIBLE = 3, 0xFFFE  # WAVE_FORMAT_IEEE_FLOAT, and the form ffmpeg writes above two channels
_MAX_HEADER_CHUNK = 1 << 20  # metadata chunks before the samples (ffmpeg's LIST of tags)
_ERROR_BYTES = 1 << 14  # the tail of ffmpeg's messages kept for the error


def _feed(stdin, data: bytes) -> None:
    try:
        stdin.write(data)
    except (BrokenPipeError, OSError):  # ffmpeg stopped reading: done (-t reached) or killed
        pass
    finally:
        try:
            stdin.close()
        except OSError:
            pass


def _drain(stderr, errors: bytearray) -> None:
    while part := stderr.read1(4096):
        errors.extend(part)
        del errors[:-_ERROR_BYTES]
    stderr.close()
