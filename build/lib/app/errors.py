"""One mapping from exceptions to HTTP answers, shared by every route and the UI.

A caller's mistake is a 4xx with a message saying what to fix; a busy engine is 429/503 with
Retry-After; anything else is a 500 whose message hides the internals (they go to the log).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from http import HTTPStatus

from engine.errors import (
    CheckpointError,
    InputError,
    QueueFullError,
    VoiceExistsError,
    VoiceNotFoundError,
)

log = logging.getLogger("app")

INTERNAL_MESSAGE = "internal error while generating audio; the server log has the details"


class HTTPProblem(Exception):
    """An error the web layer raises itself (bad content type, bad body, missing key...)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass(frozen=True)
class Problem:
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """Low-cardinality label for metrics."""
        if self.status == 429 or self.status == 503:
            return "busy"
        return "client" if self.status < 500 else "internal"


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def problem_for(exc: BaseException) -> Problem:
    if isinstance(exc, HTTPProblem):
        return Problem(exc.status, exc.message, exc.headers)
    if isinstance(exc, VoiceNotFoundError):
        return Problem(404, str(exc))
    if isinstance(exc, VoiceExistsError):
        return Problem(409, str(exc))
    if isinstance(exc, InputError):
        return Problem(400, str(exc))
    if isinstance(exc, QueueFullError):
        return Problem(429, str(exc), retry_after(exc.retry_after_s))
    if isinstance(exc, CheckpointError):
        return Problem(503, f"model not available: {exc}", retry_after(30))
    log.error("unexpected error", exc_info=exc)
    return Problem(500, INTERNAL_MESSAGE)


def error_body(problem: Problem, openai_style: bool = False) -> dict:
    """The reference server's shape; OpenAI clients read `error.message` instead."""
    reason = HTTPStatus(problem.status).phrase
    if openai_style:
        kind = "invalid_request_error" if problem.status < 500 else "server_error"
        return {"error": {"message": problem.message, "type": kind, "code": problem.status}}
    return {"statusCode": problem.status, "error": reason, "message": problem.message}
