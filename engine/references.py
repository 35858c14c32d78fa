"""Reference voices: cached codec codes for reference clips, and named voices saved on disk.

ReferenceCodeCache keeps the (10, T) codes of reference clips so a clip is encoded by the codec only
once, in memory and across restarts. VoiceStore keeps named voices (audio file + transcript) in one
folder per voice and also reads the reference server's layout (`<id>/<name>.<audio ext>` with a
sibling `<name>.lab`), so fish-speech reference folders can be dropped in as they are.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import platformdirs
import torch
from loguru import logger

from .audio import AudioSource

APP_NAME = "s1-mini-studio"


def default_cache_dir(override: str | os.PathLike | None = None) -> Path:
    """`override`, else the per-user cache dir (e.g. ~/.cache/s1-mini-studio)."""
    if override:
        return Path(override)
    # appauthor=False: otherwise Windows repeats the app name in the path.
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def default_voices_dir(override: str | os.PathLike | None = None) -> Path:
    """`override`, else `voices` in the per-user data dir (e.g. ~/.local/share/s1-mini-studio/voices)."""
    if override:
        return Path(override)
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / "voices"


def content_hash(data: bytes | bytearray | memoryview | np.ndarray) -> str:
    """sha256 hex digest of file bytes, or of an array's dtype, shape and values."""
    digest = hashlib.sha256()
    if isinstance(data, np.ndarray):
        array = np.ascontiguousarray(data)
        digest.update(f"ndarray {array.dtype.str} {array.shape}\n".encode())
        digest.update(array.data)
    elif isinstance(data, (bytes, bytearray, memoryview)):
        digest.update(data)
    else:
        raise TypeError(f"content_hash takes bytes or a numpy array, got {type(data).__name__}")
    return digest.hexdigest()


# ---- decoded clips -----------------------------------------------------------------------------


class DecodedClips:
    """Reference clips decoded before, by where they came from: a clip sent again (API clients send
    their reference with every request) or a saved voice used again is neither decoded nor hashed
    again. `decode(source)` gives (samples, key) for a source load_audio reads; file bytes are known
    by their sha256 (hashlib releases the GIL on large inputs; decoding does not), a file by its
    path, inode, size and modification and change times, so that a file written again is decoded
    again (unless it changed while it was decoded). Arrays are decoded every time (the UI hands
    uploads and recordings over as files). Keeps at most `max_bytes` of samples, least recently used
    dropped first; the samples handed out are read-only, as several requests share them. Failed
    decodes are not kept. Safe to call from several threads."""

    def __init__(self, decode, max_bytes: int = 256 << 20):
        self._decode = decode
        self._max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[np.ndarray, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, source: AudioSource) -> tuple[np.ndarray, str]:
        known_as = _source_id(source)
        if known_as is not None:
            with self._lock:
                item = self._items.get(known_as)
                if item is not None:
                    self._items.move_to_end(known_as)
                    self.hits += 1
                    return item
        samples, key = self._decode(source)
        samples.setflags(write=False)
        if known_as is not None and isinstance(source, (str, os.PathLike)) and _source_id(source) != known_as:
            known_as = None  # the file changed while it was read: which version was decoded is unknown
        if known_as is not None and samples.nbytes <= self._max_bytes:
            with self._lock:
                if known_as not in self._items:
                    self._items[known_as] = (samples, key)
                    self._bytes += samples.nbytes
                while self._bytes > self._max_bytes:
                    _, (dropped, _) = self._items.popitem(last=False)
                    self._bytes -= dropped.nbytes
        return samples, key

    def __len__(self) -> int:
        return len(self._items)


def _source_id(source: AudioSource) -> str | None:
    if isinstance(source, memoryview) and not source.c_contiguous:
        source = source.tobytes()  # hashlib reads contiguous buffers only
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "bytes " + content_hash(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            stat = os.stat(source)
        except OSError:  # load_audio says what is wrong with the path
            return None
        # The inode and change time too: a voice deleted and saved again within a coarse mtime tick
        # (FAT: 2 s) with a file of the same size must not get the old one's samples.
        return (f"file {os.path.abspath(source)} {stat.st_dev} {stat.st_ino} {stat.st_size} {stat.st_mtime_ns} "
                f"{stat.st_ctime_ns}")
    return None


# ---- codes cache -------------------------------------------------------------------------------


class ReferenceCodeCache:
    """Codec codes of reference clips, keyed by the clip's samples and the codec's fingerprint.

    The engine looks a clip up, encodes it itself when no cache has it (on the GPU worker, see
    ClipEncodeQueue.codes) and `put`s the codes. Entries live in a memory LRU of `max_items` and,
    when `cache_dir` is given, as `<key>.pt` files there, so a clip is encoded once across
    restarts. `fingerprint` must differ between codecs (e.g. checkpoint path + file hash) so that
    codes of one codec are never served for another. Safe to call from several threads.

    API clients send a clip with every request, so a server that keeps getting new ones would fill
    its disk: past `max_disk_bytes` a background thread deletes the least recently used files (a
    disk hit touches its file) down to TRIM_TO of the bound (~17 KB a 10 s clip: 1 GiB holds ~60,000).
    """

    TRIM_TO = 0.8  # of max_disk_bytes: trims, each a scan of the folder, stay rare

    def __init__(self, cache_dir: Path | None, max_items: int = 64, fingerprint: str = "",
                 max_disk_bytes: int = 1 << 30):
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._max_items = max_items
        self._max_disk_bytes = max_disk_bytes
        self._fingerprint = fingerprint
        self._memory: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._disk_bytes: int | None = None  # the folder's size, scanned at the first write
        self._trimming = threading.Event()
        self.memory_hits = 0
        self.disk_hits = 0
        self.misses = 0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "memory_hits": self.memory_hits,
                "disk_hits": self.disk_hits,
                "misses": self.misses,
                "items": len(self._memory),
            }

    def __len__(self) -> int:
        return len(self._memory)

    def key(self, samples: np.ndarray) -> str:
        return hashlib.sha256(f"{self._fingerprint}\n{content_hash(samples)}".encode()).hexdigest()

    def cached_copy(self, key: str) -> torch.Tensor | None:
        """The codes of the clip `key` (a copy) when memory or disk has them; with None, the caller
        encodes the clip itself and hands the codes to `put`."""
        codes = self._cached(key)
        return None if codes is None else codes.clone()

    def put(self, key: str, codes: torch.Tensor) -> torch.Tensor:
        """Keep the freshly encoded codes of the clip `key` (in memory and on disk); returns them."""
        codes = _checked_codes(codes)
        self._write_disk(key, codes)
        with self._lock:
            self.misses += 1
            self._memory_put(key, codes)
        return codes

    def _cached(self, key: str) -> torch.Tensor | None:
        with self._lock:
            codes = self._memory_get(key)
            if codes is not None:
                self.memory_hits += 1
                return codes
        codes = self._read_disk(key)
        if codes is not None:
            with self._lock:
                self.disk_hits += 1
                self._memory_put(key, codes)
        return codes

    def _memory_get(self, key: str) -> torch.Tensor | None:
        codes = self._memory.get(key)
        if codes is not None:
            self._memory.move_to_end(key)
        return codes

    def _memory_put(self, key: str, codes: torch.Tensor):
        self._memory[key] = codes
        self._memory.move_to_end(key)
        while len(self._memory) > self._max_items:
            self._memory.popitem(last=False)

    def _path(self, key: str) -> Path | None:
        return None if self._cache_dir is None else self._cache_dir / f"{key}.pt"

    def _read_disk(self, key: str) -> torch.Tensor | None:
        path = self._path(key)
        if path is None or not path.is_file():
            return None
        try:
            codes = _checked_codes(torch.load(path, map_location="cpu", weights_only=True))
        except FileNotFoundError:  # trimmed (by this process or another) since the check above
            return None
        except Exception as exc:  # any damage (truncated, garbage, wrong content): re-encode and overwrite
            logger.warning(f"ignoring unreadable reference-code cache file {path}: {exc}")
            return None
        try:
            os.utime(path)  # recently used: among the last to go when the folder is trimmed
        except OSError:  # a read-only cache still serves
            pass
        return codes

    def _write_disk(self, key: str, codes: torch.Tensor):
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write to a temporary file and rename it into place so readers never see half a file.
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}-", suffix=".tmp")
            os.close(fd)
            try:
                torch.save(codes, temp)
                os.replace(temp, path)
            finally:
                if os.path.exists(temp):
                    os.unlink(temp)
            self._count_disk_bytes(path.stat().st_size)
        except OSError as exc:  # the disk cache is an optimisation: keep serving from memory
            logger.warning(f"cannot write reference-code cache file {path}: {exc}")

    def _count_disk_bytes(self, written: int) -> None:
        """Add a write to the folder's size; the first write, or one past the bound, starts a scan
        (and a trim if over) off the caller's thread: the folder may hold tens of thousands of files."""
        with self._lock:
            if self._disk_bytes is not None:
                self._disk_bytes += written
            scan = self._disk_bytes is None or self._disk_bytes > self._max_disk_bytes
            scan = scan and not self._trimming.is_set()
            if scan:
                self._trimming.set()
        if scan:
            threading.Thread(target=self._trim, name="reference-code-cache-trim", daemon=True).start()

    def _files(self) -> list[tuple[float, int, Path]]:
        """(last use, size, path) of every cache file; files gone meanwhile are skipped."""
        files = []
        for path in self._cache_dir.glob("*.pt"):
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        return files

    def _trim(self) -> None:
        """Measure the folder; past the bound, delete the least recently used files until it is
        under TRIM_TO of it."""
        try:
            files = sorted(self._files())
            total, removed = sum(size for _, size, _ in files), 0
            target = self.TRIM_TO * self._max_disk_bytes if total > self._max_disk_bytes else total
            for _, size, path in files:
                if total <= target:
                    break
                try:
                    path.unlink()
                except OSError:  # gone already (another process trims too), or not ours to delete
                    continue
                total, removed = total - size, removed + 1
            with self._lock:
                self._disk_bytes = total
            if removed:
                logger.info("reference-code cache: {} least recently used files deleted, {:.0f} MB kept under {}",
                            removed, total / 1e6, self._cache_dir)
        except Exception:  # an optimisation failing: the cache still serves, the folder may grow
            logger.exception("trimming the reference-code cache failed")
        finally:
            self._trimming.clear()


def _checked_codes(codes) -> torch.Tensor:
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.dtype.is_floating_point:
        shape = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise ValueError(f"reference codes must be a 2-D integer tensor (num_codebooks, frames), got {shape}")
    return codes.detach().to("cpu")
