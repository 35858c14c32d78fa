"""Saved voices: named reference clips with their transcripts, one folder per voice."""

from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from filelock import FileLock
from loguru import logger

from .audio import SAMPLE_RATE, AudioSource, encode_audio, guess_audio_extension, load_audio
from .errors import InputError, VoiceExistsError, VoiceNotFoundError

VOICE_ID_PATTERN = re.compile(r"^[a-zA-Z0-9\-_ ]+$")
MAX_VOICE_ID_LENGTH = 255
TRANSCRIPT_FILE = "transcript.txt"
AUDIO_STEM = "sample"
AUDIO_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".aac", ".webm", ".aiff", ".aif"})
# Folders a store works in beside the voices: `<prefix><pid>-<uuid>`. Names starting with "." are
# never voice ids, so they are never listed.
ADDING_PREFIX, DELETED_PREFIX = ".adding-", ".deleted-"
# Names Windows keeps for devices in any case: a file or folder of that name there opens the device.
WINDOWS_DEVICE_NAMES = frozenset({"CON", "PRN", "AUX", "NUL",
                                  *(f"{port}{n}" for port in ("COM", "LPT") for n in range(1, 10))})


def check_voice_id(voice_id: str) -> str:
    """`voice_id` if it is a valid folder name for a voice, else InputError saying why."""
    if not isinstance(voice_id, str) or not voice_id:
        raise InputError("the voice id must be a non-empty string")
    if len(voice_id) > MAX_VOICE_ID_LENGTH:
        raise InputError(f"the voice id is {len(voice_id)} characters long; the limit is {MAX_VOICE_ID_LENGTH}")
    if not VOICE_ID_PATTERN.match(voice_id):
        raise InputError(
            f"invalid voice id {voice_id!r}: use only letters a-z A-Z, digits, '-', '_' and spaces"
        )
    if voice_id != voice_id.strip():
        raise InputError(f"invalid voice id {voice_id!r}: it must not start or end with a space")
    return voice_id


def is_windows_device_name(name: str) -> bool:
    return name.upper() in WINDOWS_DEVICE_NAMES


def check_new_voice_id(voice_id: str) -> str:
    """check_voice_id, and not a name Windows keeps for a device (a voices folder may move there;
    voices saved under one elsewhere stay readable)."""
    check_voice_id(voice_id)
    if is_windows_device_name(voice_id):
        raise InputError(f"invalid voice id {voice_id!r}: Windows keeps that name for a device; choose another id")
    return voice_id


class VoiceStore:
    """Named voices under `root`, one folder per voice id: an audio file plus its transcript.

    Our own layout is `<id>/sample.<ext>` + `<id>/transcript.txt`; the reference server's
    `<id>/<name>.<ext>` + `<id>/<name>.lab` is read as well. Ids ignore case, on every file system:
    "narrator" finds the voice saved as "Narrator", and a second voice of the same id in another case
    is refused. Folders appear and disappear by
    rename, so readers never see half a voice, and nothing is cached: every process sharing the
    folder (the replicas of a cluster) sees an add, rename or delete at once. Writers, threads or
    processes, take turns through a lock file in the folder (`.lock`; on a shared volume across
    machines the file system must honour flock, as NFSv4 and CephFS do).
    """

    LOCK_FILE = ".lock"  # a dot name can never be a voice id

    def __init__(self, root: str | os.PathLike, *, max_seconds: float | None = None,
                 check_voice: Callable[[np.ndarray, str], None] | None = None):
        """check_voice(samples, transcript): raises InputError for a voice that could never be used
        (the engine: its prompt would not fit the model's context)."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._max_seconds = max_seconds
        self._check_voice = check_voice
        self._lock = threading.RLock()
        self._writers = FileLock(self.root / self.LOCK_FILE)
        self.remove_leftovers()

    def remove_leftovers(self) -> list[str]:
        """Remove the half-added and half-deleted folders of store processes that died mid-way (a
        crash, kill -9); those of running ones stay. Returns the names removed (and logs them)."""
        removed = []
        with self._writing():  # an add in progress anywhere holds the lock: its folder is never seen here
            for child in self.root.iterdir():
                if child.name.startswith((ADDING_PREFIX, DELETED_PREFIX)) and not _owner_alive(child.name):
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child.name)
        if removed:
            logger.warning("voices: removed {} folder(s) left by an interrupted add or delete: {}", len(removed),
                           ", ".join(sorted(removed)))
        return removed

    def exists(self, voice_id: str) -> bool:
        """Whether a voice of this id (in any case) exists (False for an invalid id)."""
        try:
            check_voice_id(voice_id)
        except InputError:
            return False
        return self._folder(voice_id) is not None

    def list(self) -> list[str]:
        """Sorted ids of the folders that hold a usable voice."""
        with self._lock:
            return sorted(
                child.name
                for child in self.root.iterdir()
                if child.is_dir() and VOICE_ID_PATTERN.match(child.name) and _find_voice(child) is not None
            )

    def get(self, voice_id: str) -> tuple[Path, str]:
        """(audio file path, transcript) of a saved voice."""
        check_voice_id(voice_id)
        with self._lock:
            folder = self._folder(voice_id)
            if folder is None:
                raise VoiceNotFoundError(self.not_found_message(voice_id))
            found = _find_voice(folder)
        if found is None:
            raise VoiceNotFoundError(
                f"saved voice {voice_id!r} is incomplete: its folder needs an audio file and its "
                f"transcript ({TRANSCRIPT_FILE}, or a .lab file with the audio file's name)"
            )
        return found

    def add(self, voice_id: str, audio_source: AudioSource, transcript: str) -> Path:
        """Save a voice; returns its folder. The audio is checked with load_audio first."""
        check_new_voice_id(voice_id)
        if not isinstance(transcript, str) or not transcript.strip():
            raise InputError("the transcript is empty; type exactly what is said in the reference clip")
        try:
            transcript.encode("utf-8")  # what its file holds
        except UnicodeEncodeError:
            raise InputError("the transcript holds a character that is not text (an unpaired surrogate, as a lone "
                             "\\ud800 escape in JSON makes); send the words as plain Unicode text") from None
        samples = load_audio(audio_source, max_seconds=self._max_seconds)
        if self._check_voice is not None:
            self._check_voice(samples, transcript.strip())
        data, extension = _audio_file_content(audio_source, samples)
        with self._writing():
            existing = self._folder(voice_id)
            if existing is not None:
                raise VoiceExistsError(
                    f"a voice named {existing.name!r} already exists (ids ignore case); choose another id, or "
                    "delete or rename the old one"
                )
            target = self.root / voice_id
            staging = self._work_dir(ADDING_PREFIX)
            staging.mkdir()
            try:
                (staging / f"{AUDIO_STEM}.{extension}").write_bytes(data)
                (staging / TRANSCRIPT_FILE).write_text(transcript.strip() + "\n", encoding="utf-8")
                os.rename(staging, target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return target

    def delete(self, voice_id: str):
        check_voice_id(voice_id)
        with self._writing():
            folder = self._folder(voice_id)
            if folder is None:
                raise VoiceNotFoundError(self.not_found_message(voice_id))
            trash = self._work_dir(DELETED_PREFIX)
            os.rename(folder, trash)  # the voice disappears at once; removing the files can take a while
        shutil.rmtree(trash, ignore_errors=True)

    def rename(self, old_id: str, new_id: str):
        check_voice_id(old_id)
        check_new_voice_id(new_id)
        with self._writing():
            source, taken = self._folder(old_id), self._folder(new_id)
            if source is None:
                raise VoiceNotFoundError(self.not_found_message(old_id))
            # "alice" -> "Alice" renames a voice to its own id in another case.
            if taken is not None and not os.path.samefile(source, taken):
                raise VoiceExistsError(f"a voice named {taken.name!r} already exists (ids ignore case); choose another name")
            os.rename(source, self.root / new_id)  # one step: a crash leaves the voice under one of its names

    def _folder(self, voice_id: str) -> Path | None:
        """The folder of the voice `voice_id` names: of that name, else of that name in another case."""
        exact = self.root / voice_id
        if exact.is_dir():
            return exact
        wanted = voice_id.casefold()
        return next((child for child in self.root.iterdir()
                     if child.name.casefold() == wanted and child.is_dir() and VOICE_ID_PATTERN.match(child.name)), None)

    def _work_dir(self, prefix: str) -> Path:
        return self.root / f"{prefix}{os.getpid()}-{uuid.uuid4().hex}"

    @contextmanager
    def _writing(self):
        """One writer at a time: this process's threads, then every process sharing the folder."""
        with self._lock, self._writers:
            yield

    @staticmethod
    def not_found_message(voice_id: str) -> str:
        """Names the id and how to see the saved ones; lists neither them nor where they are kept."""
        return (
            f"voice not found: no saved voice named {voice_id!r}. The saved voices are listed in the UI's "
            "Voice clone tab and by GET /v1/references/list; save one there or with POST /v1/references/add."
        )


def _owner_alive(work_dir_name: str) -> bool:
    """Whether the process that made a `<prefix><pid>-<uuid>` folder still runs (not this one: it
    has made none yet when it looks). Unknown names, and Windows, where no probe is safe, count as
    dead."""
    pid_text = work_dir_name.split("-", 2)[1] if work_dir_name.count("-") >= 2 else ""
    if not pid_text.isdigit() or int(pid_text) == os.getpid() or os.name == "nt":
        return False
    try:
        os.kill(int(pid_text), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def _find_voice(folder: Path) -> tuple[Path, str] | None:
    """(audio path, transcript) in a voice folder, or None when it holds no usable pair."""
    try:
        audio_files = sorted(
            path for path in folder.iterdir() if path.is_file() and path.suffix.lower() in AUDIO_EXTENSIONS
        )
    except OSError:  # removed or renamed meanwhile
        return None
    candidates = [(audio, folder / TRANSCRIPT_FILE) for audio in audio_files]
    candidates += [(audio, audio.with_suffix(".lab")) for audio in audio_files]
    for audio, transcript_path in candidates:
        transcript = _read_text(transcript_path)
        if transcript:
            return audio, transcript
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _audio_file_content(source: AudioSource, samples: np.ndarray) -> tuple[bytes, str]:
    """(file bytes, extension) to store: the file as given when its type is known, else a WAV."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        data = path.read_bytes()
        if path.suffix.lower() in AUDIO_EXTENSIONS:
            return data, path.suffix.lower().lstrip(".")
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        data = b""
    extension = guess_audio_extension(data)
    if extension is not None:
        return data, extension
    return encode_audio(samples, SAMPLE_RATE, "wav"), "wav"
