"""POST /v1/tts (fish-speech schema), /v1/audio/speech (OpenAI) and /v1/tts/batch."""

from __future__ import annotations

import base64
import logging
import numbers
from collections.abc import AsyncIterator

import ormsgpack
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from engine.audio import encode_audio
from engine.errors import VoiceNotFoundError
from engine.facade import SynthesisResult
from engine.params import SamplingParams

from .api_schema import BatchTTSRequest, SpeechRequest, TTSRequest
from .audio_out import audio_response, check_streamable, pcm16_chunks, streaming_audio_response
from .body import BODY_TYPES, JSON, MSGPACK, read_body
from .bridge import iterate_in_thread
from .errors import HTTPProblem, problem_for
from .openapi import request_body
from .service import StreamStats, Synthesizer, Voice
from .settings import AppSettings

log = logging.getLogger("app")

# OpenAI clients always name a voice; these names mean "the default voice" unless saved here.
OPENAI_VOICE_NAMES = frozenset(
    "default alloy ash ballad coral echo fable onyx nova sage shimmer verse marin cedar".split()
)


async def _first_then_rest(chunks: AsyncIterator) -> AsyncIterator:
    """Waits for the first chunk so that input errors still become a 4xx before any byte is sent."""
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        first = None

    async def rest():
        try:
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk
        except Exception as e:
            # The status is sent: abort the response (no final chunk), so that the client sees an error
            # instead of a short file that looks complete.
            log.error("stream ended early: %s", problem_for(e).message)
            raise
        finally:
            await chunks.aclose()

    return rest()


def build_router(synth: Synthesizer, settings: AppSettings) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["speech"])

    async def speak(text: str, voice: Voice, params: SamplingParams, fmt: str, streaming: bool) -> Response:
        if not streaming:
            result = await run_in_threadpool(synth.synthesize, text, voice, params)
            return audio_response(result.audio, result.sample_rate, fmt)
        check_streamable(fmt)
        stats = StreamStats(synth.sample_rate)
        chunks = await _first_then_rest(iterate_in_thread(lambda: pcm16_chunks(synth.stream(text, voice, params, stats))))
        return streaming_audio_response(chunks, synth.sample_rate, fmt)

    @router.post(
        "/tts",
        summary="Text to speech (fish-speech ServeTTSRequest)",
        response_class=Response,
        openapi_extra=request_body(TTSRequest, BODY_TYPES),
        responses={200: {"content": {"audio/wav": {}}, "description": "Audio in the requested format."}},
    )
    async def tts(request: Request):
        """JSON, msgpack or multipart body. In multipart, inline references are repeated
        `reference_audio` file parts, each with a `reference_text` part in the same order."""
        req = await read_body(request, TTSRequest)
        return await speak(req.text, Voice.of(req), req.sampling_params(), req.format, req.streaming)

    @router.post(
        "/audio/speech",
        summary="Text to speech (OpenAI-compatible)",
        response_class=Response,
        responses={200: {"content": {"audio/mpeg": {}}, "description": "Audio in response_format."}},
    )
    async def openai_speech(body: SpeechRequest):
        if body.speed != 1.0:
            raise HTTPProblem(400, "speed other than 1.0 is not supported by this model")
        voice = await run_in_threadpool(_openai_voice, synth.engine.voices, body.voice)
        return await speak(body.input, voice, body.sampling_params(), body.response_format, body.stream)

    @router.post(
        "/tts/batch",
        summary="Several texts, one voice, one response with per-item results",
        openapi_extra=request_body(BatchTTSRequest, (JSON, MSGPACK)),
    )
    async def tts_batch(request: Request):
        """Answers JSON (audio base64-encoded) or, with `Accept: application/msgpack`, msgpack
        (audio as bytes). A failed item carries its own error; the others still succeed."""
        req = await read_body(request, BatchTTSRequest)
        if len(req.texts) > settings.max_batch_items:
            raise HTTPProblem(422, f"at most {settings.max_batch_items} texts per batch; got {len(req.texts)}")
        results = await run_in_threadpool(synth.batch, req.texts, Voice.of(req), req.sampling_params())
        as_msgpack = MSGPACK in request.headers.get("accept", "")
        items = [_batch_item(i, r, req.format, as_msgpack) for i, r in enumerate(results)]
        body = {"format": req.format, "sample_rate": synth.sample_rate, "results": items}
        if as_msgpack:
            return Response(ormsgpack.packb(body), media_type=MSGPACK)
        return JSONResponse(body)

    return router


def _openai_voice(store, name: str) -> Voice:
    if store.exists(name):
        return Voice(voice_id=name)
    if name.lower() in OPENAI_VOICE_NAMES:
        return Voice()
    raise VoiceNotFoundError(f"voice {name!r} is not a saved voice; saved voices: {', '.join(store.list()) or 'none'}")


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
        "stats": {k: float(v) for k, v in result.stats.items() if isinstance(v, numbers.Real)},
    }
