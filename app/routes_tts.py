"""POST /v1/tts (fish-speech's and Fish Audio's schema) and /v1/tts/batch."""

from __future__ import annotations

import base64
import logging
import numbers
import threading

import ormsgpack
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from engine.audio import MIME_TYPES, encode_audio
from engine.facade import SynthesisResult

from .api_schema import AUDIO_FORMATS, BatchTTSRequest, TTSRequest
from .body import BODY_TYPES, JSON, MSGPACK, read_body
from .bridge import call_in_thread, until_disconnected
from .errors import HTTPProblem, error_responses, problem_for
from .openapi import request_body
from .settings import AppSettings
from .speech import CLIENT_CLOSED_REQUEST, SpeechService, Voice, streamed_audio, whole_audio

log = logging.getLogger("app")

# Fish Audio's SDKs name a model in this header on every request; their answers stream.
FISH_MODEL_HEADER = "model"
FISH_MODELS = ("s1", "s1-mini", "openaudio-s1-mini", "s2-pro", "speech-1.5", "speech-1.6")
SPEECH_ERRORS = (400, 404, 413, 415, 422, 429)


def _streams(request: Request, req: TTSRequest) -> bool:
    """`streaming` when given; otherwise what the client expects: Fish Audio's API streams."""
    model = request.headers.get(FISH_MODEL_HEADER)
    if model is not None and model not in FISH_MODELS:
        raise HTTPProblem(400, f"model header {model!r} is not served here; send one of {', '.join(FISH_MODELS)} "
                          "(each is answered by S1-mini)")
    if "streaming" in req.model_fields_set:
        return req.streaming
    return model is not None


def build_router(synth: SpeechService, settings: AppSettings) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["speech"])

    @router.post(
        "/tts",
        summary="Text to speech (fish-speech ServeTTSRequest, Fish Audio's TTS request)",
        response_class=Response,
        openapi_extra=request_body(TTSRequest, BODY_TYPES),
        responses={
            200: {"content": {MIME_TYPES[f]: {} for f in AUDIO_FORMATS}, "description": "Audio in `format`."},
            **error_responses(*SPEECH_ERRORS),
        },
    )
    async def tts(request: Request):
        """JSON, msgpack or multipart body. In multipart, inline references are repeated
        `reference_audio` file parts, each with a `reference_text` part in the same order."""
        req = await read_body(request, TTSRequest)
        spec = req.output_spec(req.format)
        voice, params = Voice.of(req), req.sampling_params()
        if _streams(request, req):
            return await streamed_audio(synth, req.text, voice, params, spec)
        return await whole_audio(request, synth, req.text, voice, params, spec)

    @router.post(
        "/tts/batch",
        summary="Several texts, one voice, one response with per-item results",
        openapi_extra=request_body(BatchTTSRequest, (JSON, MSGPACK)),
        responses=error_responses(400, 413, 415, 422, 429),
    )
    async def tts_batch(request: Request):
        """Answers JSON (audio base64-encoded) or, with `Accept: application/msgpack`, msgpack
        (audio as bytes). A failed item carries its own error; the others still succeed."""
        req = await read_body(request, BatchTTSRequest, (JSON, MSGPACK))
        if len(req.texts) > settings.max_batch_items:
            raise HTTPProblem(422, f"at most {settings.max_batch_items} texts per batch; got {len(req.texts)}")
        stop = threading.Event()
        work = call_in_thread(lambda: synth.batch(req.texts, Voice.of(req), req.sampling_params(), stop=stop))
        connected, results = await until_disconnected(request.receive, work)
        if not connected:
            stop.set()  # the items still running end at their next piece of audio
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        as_msgpack = MSGPACK in request.headers.get("accept", "")
        items = await call_in_thread(lambda: [_batch_item(i, r, req.format, as_msgpack) for i, r in enumerate(results)])
        body = {"format": req.format, "sample_rate": synth.sample_rate, "results": items}
        if as_msgpack:
            return Response(ormsgpack.packb(body), media_type=MSGPACK)
        return JSONResponse(body)

    return router


def _batch_item(index: int, result: SynthesisResult | Exception, fmt: str, raw_bytes: bool) -> dict:
    if isinstance(result, Exception):
        problem = problem_for(result)
        return {"index": index, "ok": False, "error": {"status": problem.status, "message": problem.message}}
    audio = encode_audio(result.audio, result.sample_rate, fmt)
    return {
        "index": index,
        "ok": True,
        "audio": audio if raw_bytes else base64.b64encode(audio).decode("ascii"),
        "duration_s": round(result.stats.get("audio_s", len(result.audio) / result.sample_rate), 3),
        "stats": {k: int(v) if isinstance(v, numbers.Integral) else float(v)
                  for k, v in result.stats.items() if isinstance(v, numbers.Real)},
    }
