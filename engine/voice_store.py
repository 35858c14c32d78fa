"""Saved voices: named reference clips with their transcripts, one folder per voice."""

from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from pathlib import Path

import numpy as np

from .audio import SAMPLE_RATE, AudioSource, encode_audio, guess_audio_extension, load_audio
from .errors import InputError, VoiceExistsError, VoiceNotFoundError

VOICE_ID_PATTERN = re.compile(r"^[a-zA-Z0-9\-_ ]+$")
MAX_VOICE_ID_LENGTH = 255
TRANSCRIPT_FILE = "transcript.txt"
AUDIO_STEM = "sample"
AUDIO_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".aac", ".webm", ".aiff", ".aif"})


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


class VoiceStore:
    """Named voices under `root`, one folder per voice id: an audio file plus its transcript.

    Our own layout is `<id>/sample.<ext>` + `<id>/transcript.txt`; the reference server's
    `<id>/<name>.<ext>` + `<id>/<name>.lab` is read as well. Safe for concurrent use by threads;
    folders appear and disappear by rename, so other processes never see half a voice.
    """

    def __init__(self, root: str | os.PathLike, *, max_seconds: float | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._max_seconds = max_seconds
        self._lock = threading.RLock()

    def exists(self, voice_id: str) -> bool:
        """Whether a folder named `voice_id` exists (False for an invalid id)."""
        try:
            check_voice_id(voice_id)
        except InputError:
            return False
        return (self.root / voice_id).is_dir()

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
            folder = self.root / voice_id
            if not folder.is_dir():
                raise VoiceNotFoundError(self._not_found_message(voice_id))
            found = _find_voice(folder)
        if found is None:
            raise VoiceNotFoundError(
                f"saved voice {voice_id!r} at {folder} is incomplete: it needs an audio file and its "
                f"transcript ({TRANSCRIPT_FILE}, or a .lab file with the audio file's name)"
            )
        return found

    def add(self, voice_id: str, audio_source: AudioSource, transcript: str) -> Path:
        """Save a voice; returns its folder. The audio is checked with load_audio first."""
        check_voice_id(voice_id)
        if not isinstance(transcript, str) or not transcript.strip():
            raise InputError("the transcript is empty; type exactly what is said in the reference clip")
        samples = load_audio(audio_source, max_seconds=self._max_seconds)
        data, extension = _audio_file_content(audio_source, samples)
        with self._lock:
            target = self.root / voice_id
            if target.exists():
                raise VoiceExistsError(
                    f"a voice named {voice_id!r} already exists; choose another id, or delete or rename the old one"
                )
            staging = self._staging_dir()
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
        with self._lock:
            folder = self.root / voice_id
            if not folder.is_dir():
                raise VoiceNotFoundError(self._not_found_message(voice_id))
            trash = self.root / f".deleted-{uuid.uuid4().hex}"
            os.rename(folder, trash)  # the voice disappears at once; removing the files can take a while
        shutil.rmtree(trash, ignore_errors=True)

    def rename(self, old_id: str, new_id: str):
        check_voice_id(old_id)
        check_voice_id(new_id)
        with self._lock:
            source, target = self.root / old_id, self.root / new_id
            if not source.is_dir():
                raise VoiceNotFoundError(self._not_found_message(old_id))
            # On case-insensitive file systems "alice" -> "Alice" finds the target already "there".
            if target.exists() and not os.path.samefile(source, target):
                raise VoiceExistsError(f"a voice named {new_id!r} already exists; choose another name")
            staging = self.root / f".renaming-{uuid.uuid4().hex}"
            os.rename(source, staging)
            os.rename(staging, target)

    def _staging_dir(self) -> Path:
        # Names starting with "." can never be voice ids, so staging folders are never listed.
        staging = self.root / f".adding-{uuid.uuid4().hex}"
        staging.mkdir()
        return staging

    def _not_found_message(self, voice_id: str) -> str:
        saved = self.list()
        return (
            f"no saved voice named {voice_id!r}. Saved voices: {', '.join(saved) if saved else 'none yet'}. "
            "Save one from a reference clip and its transcript, or put a folder with that name holding an "
            f"audio file and a .lab transcript of the same name into {self.root}."
        )


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
