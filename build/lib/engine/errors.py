"""Exception types shared by the engine and the app.

The app maps them to HTTP status codes: InputError -> 4xx, CheckpointError -> 503 at start-up,
QueueFullError -> 429/503 with Retry-After. Messages are written for the person who made the
mistake: what was wrong and what to do.
"""


class S1Error(Exception):
    """Base class of every error the engine raises on purpose."""


class InputError(S1Error, ValueError):
    """The caller's input is invalid (text, reference audio, sampling parameters, voice id)."""


class VoiceNotFoundError(InputError, KeyError):
    """A saved-voice id that does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "voice not found"


class VoiceExistsError(InputError):
    """A saved voice with that id already exists."""


class CheckpointError(S1Error):
    """The checkpoint is missing, incomplete, of the wrong shape or cannot be downloaded."""


class DeviceError(S1Error):
    """The chosen device cannot run the requested mode (precision, quantization, compile)."""


class QueueFullError(S1Error):
    """The engine's waiting queue is full; retry after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Cancelled(S1Error):
    """The caller of a request went away (closed its stream, disconnected); its work was dropped."""
