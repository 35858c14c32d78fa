"""One mapping from exceptions to HTTP answers, shared by every route and the UI.

A caller's mistake is a 4xx with a message saying what to fix; a busy engine is 429/503 with
Retry-After; anything else is a 500 whose message hides the internals (they go to the log).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from http import HTTPStatus

from pydantic import BaseModel, Field

from engine.errors import (
    CheckpointError,
    InputError,
    QueueFullError,
    VoiceExistsError,
    VoiceNotFoundError,
)

log = logging.getLogger("app")

INTERNAL_MESSAGE = "internal error while generating audio; the server log has the details"
# OpenAI's routes answer errors in OpenAI's shape, which their SDKs read.
OPENAI_PREFIXES = ("/v1/audio/", "/v1/models")  # routes whose errors take OpenAI's shape (`error.message`)


def openai_style(path: str) -> bool:
    return path.startswith(OPENAI_PREFIXES)


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


# OpenAI's `error.code` is a string (or null); ours name the status (rate_limit_exceeded and
# invalid_api_key as OpenAI's own).
OPENAI_CODES = {400: "invalid_request", 401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed",
                409: "conflict", 413: "request_too_large", 415: "unsupported_media_type", 422: "invalid_value",
                429: "rate_limit_exceeded", 500: "internal_error", 503: "service_unavailable"}


def error_body(problem: Problem, openai: bool = False) -> dict:
    """The reference server's shape (ErrorBody); OpenAI clients read `error.message` (OpenAIErrorBody)."""
    reason = HTTPStatus(problem.status).phrase
    if openai:
        kind = "invalid_request_error" if problem.status < 500 else "server_error"
        return {"error": {"message": problem.message, "type": kind, "param": None,
                          "code": OPENAI_CODES.get(problem.status, f"http_{problem.status}")}}
    return {"statusCode": problem.status, "error": reason, "message": problem.message, "detail": problem.message}


# ---- the documented error shapes ------------------------------------------------------------------


class ErrorBody(BaseModel):
    """Every error of the fish-speech style routes."""

    statusCode: int = Field(description="The HTTP status again.")  # noqa: N815 (the reference server's name)
    error: str = Field(description="The status's reason phrase.")
    message: str = Field(description="What was wrong and what to do.")
    detail: str = Field(description="The message again, where clients of FastAPI's shape (the legacy "
                                    "fish_audio_sdk) read it.")


class OpenAIError(BaseModel):
    message: str = Field(description="What was wrong and what to do.")
    type: str = Field(description="invalid_request_error (4xx) or server_error (5xx).")
    param: str | None = Field(description="Always null: the message names the field.")
    code: str = Field(description="Names the status: `invalid_request` (400), `invalid_api_key`, `not_found`, "
                                  "`invalid_value` (422), `rate_limit_exceeded` (429), `service_unavailable`, ...")


class OpenAIErrorBody(BaseModel):
    """Every error of the OpenAI-compatible routes (/v1/audio/...)."""

    error: OpenAIError


ERROR_MEANINGS = {
    400: "The body cannot be read (not valid JSON, msgpack or multipart) or its values cannot be used.",
    401: "The API key is missing or wrong.",
    404: "The saved voice does not exist.",
    405: "The route does not take this method; `Allow` lists those it takes.",
    409: "A saved voice with that id already exists.",
    413: "The body is over the server's size limit.",
    415: "The Content-Type is not one the route reads.",
    422: "A field is missing, of the wrong type or out of range.",
    429: "The engine's queue is full; retry after `Retry-After` seconds.",
    500: "An unexpected error; the server log has the details.",
    503: "The model is still loading or warming up; retry after `Retry-After` seconds.",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


def error_responses(*statuses: int, openai: bool = False) -> dict:
    """A route's `responses=`: each status it answers besides 200, in the error shape its path uses.
    401 and 500 are added to every operation by app.openapi."""
    model = OpenAIErrorBody if openai else ErrorBody
    responses = {}
    for status in statuses:
        responses[status] = {"model": model, "description": ERROR_MEANINGS[status]}
        if status in (429, 503):
            responses[status]["headers"] = _RETRY_AFTER
    return responses
