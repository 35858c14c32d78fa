"""Amazon SageMaker's inference container contract: GET /ping and POST /invocations.

SageMaker probes /ping until it answers 200 and sends every InvokeEndpoint call to /invocations with
the caller's ContentType and Accept. The body is /v1/tts's (JSON or msgpack, same fields); the Accept
header picks the audio format (the body's `format` when Accept names none). The whole clip comes
back in one response, or, with `"streaming": true` (InvokeEndpointWithResponseStream), as it is
made. The routes are on every server, not only in the container's `serve` mode,
so the contract is tested without a container.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from engine.audio import MIME_TYPES

from .api_schema import TTSRequest
from .body import JSON, MSGPACK, read_body
from .errors import HTTPProblem, error_responses, retry_after
from .openapi import request_body
from .speech import SpeechService, Voice, streamed_audio, whole_audio

# Accept values to formats: the MIME types the API answers with, plus the usual aliases.
ACCEPTED = {
    **{mime: fmt for fmt, mime in MIME_TYPES.items()},
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/mp3": "mp3",
    "audio/opus": "opus",
    "audio/l16": "pcm",
}
ANY = {"*/*", "audio/*", "application/octet-stream"}  # whatever the body's `format` asks for


def format_from_accept(accept: str | None, body_format: str) -> str:
    """The audio format the Accept header asks for, by quality (q) then order; `body_format` when it
    asks for any audio, or when the header is missing or empty."""
    ranked, named = [], False
    for position, item in enumerate((accept or "").split(",")):
        mime, *params = (part.strip().lower() for part in item.split(";"))
        if not mime:
            continue
        named = True
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality > 0:
            ranked.append((-quality, position, mime))
    if not named:
        return body_format
    for _, _, mime in sorted(ranked):
        if mime in ANY:
            return body_format
        if mime in ACCEPTED:
            return ACCEPTED[mime]
    raise HTTPProblem(
        406, f"cannot answer with {accept!r}; Accept one of {', '.join(sorted(ACCEPTED))} (or */* for the body's format)"
    )


def build_router(synth: SpeechService) -> APIRouter:
    router = APIRouter(tags=["sagemaker"])

    @router.get("/ping", summary="SageMaker health check: 200 once the model is ready, 503 before",
                responses=error_responses(503))
    async def ping():
        if synth.engine.is_ready:
            return {"status": "ready"}
        raise HTTPProblem(503, "the model is still loading or warming up", retry_after(5))

    @router.post(
        "/invocations",
        summary="SageMaker inference: /v1/tts's body, the Accept header picks the audio format",
        response_class=Response,
        openapi_extra=request_body(TTSRequest, (JSON, MSGPACK)),
        responses={
            200: {"content": {mime: {} for mime in MIME_TYPES.values()}, "description": "The clip, whole or streamed."},
            406: {"description": "Accept names no audio format this server writes."},
            **error_responses(400, 404, 413, 415, 422, 429),
        },
    )
    async def invocations(request: Request):
        req = await read_body(request, TTSRequest)
        spec = req.output_spec(format_from_accept(request.headers.get("accept"), req.format))
        voice, params = Voice.of(req), req.sampling_params()
        if req.streaming:
            return await streamed_audio(synth, req.text, voice, params, spec)
        return await whole_audio(request, synth, req.text, voice, params, spec)

    return router
