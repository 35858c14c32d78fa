"""OpenAI's speech API: POST /v1/audio/speech, GET /v1/models, and GET /v1/audio/voices (as
Kokoro-FastAPI and vllm-omni offer it).

Every answer of /v1/audio/speech streams: `stream_format` "audio" sends the encoded bytes as they are
produced, "sse" sends `speech.audio.delta` events (base64 audio) and a final `speech.audio.done`
with token usage. OpenAI's voice names map to saved voices through AppSettings.openai_voices.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from engine.audio import MIME_TYPES
from engine.audio_stream import OutputSpec
from engine.errors import VoiceNotFoundError

from .api_schema import SpeechRequest, VoiceId
from .body import JSON, MSGPACK, read_body
from .errors import HTTPProblem, error_responses
from .openapi import request_body
from .settings import AppSettings
from .speech import SpeechService, StreamStats, Voice, audio_bytes, streamed_audio, timing_headers

MODEL_ID = "s1-mini"
# OpenAI's model names, served by the same model so that clients written for OpenAI work unchanged.
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
SERVED_MODELS = (MODEL_ID, *MODEL_ALIASES)
OPENAI_VOICE_NAMES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar",
)
PCM_SAMPLE_RATE = 24000  # OpenAI's pcm: 24 kHz 16-bit little-endian mono
_CREATED = int(time.time())

AUDIO_CONTENT = {MIME_TYPES[f]: {} for f in SpeechRequest.model_fields["response_format"].annotation.__args__}


def _model_card(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": _CREATED, "owned_by": "s1-mini-studio"}


def resolve_voice(store, mapping: dict[str, str], body: SpeechRequest) -> Voice:
    """The voice a request names. Inline references go with an OpenAI voice name (which clients must
    send) or none; with a saved voice they would contradict it, so that is refused."""
    name = (body.voice.id if isinstance(body.voice, VoiceId) else body.voice) or "default"
    if body.reference_id:
        if name.lower() not in OPENAI_VOICE_NAMES and name.casefold() not in ("default", body.reference_id.casefold()):
            raise HTTPProblem(400, f"voice {name!r} and reference_id {body.reference_id!r} name different voices; "
                              "send one of them")
        name = body.reference_id
    saved = _saved_voice(store, mapping, name)
    if body.references:
        if saved:
            raise HTTPProblem(400, f"references clone a voice, and {name!r} names the saved voice {saved!r}: send "
                              "inline references with an OpenAI voice name such as \"alloy\" (unmapped), or drop them")
        return Voice(references=tuple(Voice.of(body).references))
    return Voice(voice_id=saved)


def _saved_voice(store, mapping: dict[str, str], name: str) -> str | None:
    if store.exists(name):
        return name
    if name == "default" or name.lower() in OPENAI_VOICE_NAMES:
        mapped = mapping.get(name.lower())
        if mapped and not store.exists(mapped):
            raise VoiceNotFoundError(f"voice not found: {name!r} is mapped to the saved voice {mapped!r}, which does not exist; "
                                     "save it under that id (POST /v1/references/add) or change --openai-voices")
        return mapped
    raise VoiceNotFoundError(f"voice not found: {name!r} is not a saved voice or an OpenAI voice name; "
                             "GET /v1/audio/voices (or /v1/references/list) lists the voices")


def build_router(synth: SpeechService, settings: AppSettings) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])
    store = synth.engine.voices

    @router.get("/models", summary="Models (OpenAI's list format)")
    async def list_models():
        return {"object": "list", "data": [_model_card(m) for m in SERVED_MODELS]}

    @router.get("/models/{model_id}", summary="One model (OpenAI's format)", responses=error_responses(404, openai=True))
    async def get_model(model_id: str):
        if model_id not in SERVED_MODELS:
            raise HTTPProblem(404, f"model {model_id!r} is not served here; GET /v1/models lists the models")
        return _model_card(model_id)

    @router.get("/audio/voices", summary="Voices that /v1/audio/speech accepts: saved voices, then OpenAI's names")
    async def list_voices():
        saved = sorted(await run_in_threadpool(store.list))
        return {"voices": saved + [v for v in OPENAI_VOICE_NAMES if v not in saved]}

    @router.post(
        "/audio/speech",
        summary="Text to speech (OpenAI)",
        response_class=Response,
        openapi_extra=request_body(SpeechRequest, (JSON, MSGPACK)),
        responses={200: {"content": {**AUDIO_CONTENT, "text/event-stream": {}},
                         "description": "Audio in response_format, streamed; or server-sent events (stream_format sse)."},
                   **error_responses(400, 404, 413, 415, 422, 429, openai=True)},
    )
    async def openai_speech(request: Request):
        body = await read_body(request, SpeechRequest, (JSON, MSGPACK))
        if body.model not in SERVED_MODELS:
            raise HTTPProblem(400, f"model {body.model!r} is not served here; use one of {', '.join(SERVED_MODELS)}")
        if body.instructions and body.instructions.strip():
            raise HTTPProblem(400, "instructions are not supported by S1-mini: put tone and emotion markers in the "
                              "input text instead, e.g. \"(excited) Hello!\", and leave instructions out")
        voice = await run_in_threadpool(resolve_voice, store, settings.openai_voices, body)
        rate = body.sample_rate or (PCM_SAMPLE_RATE if body.response_format == "pcm" else None)
        spec = OutputSpec(body.response_format, rate, body.speed)
        params = body.sampling_params()
        if body.stream_format == "audio":
            return await streamed_audio(synth, body.input, voice, params, spec)
        stats = StreamStats(synth.sample_rate)
        chunks = await audio_bytes(synth, body.input, voice, params, spec, stats)
        events = _sse_events(chunks, lambda: _usage(synth, body.input, stats))
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **timing_headers(stats)})

    return router


async def _sse_events(chunks: AsyncIterator[bytes], usage) -> AsyncIterator[bytes]:
    async for data in chunks:
        yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
    yield _event({"type": "speech.audio.done", "usage": usage()})


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _usage(synth: SpeechService, text: str, stats: StreamStats) -> dict:
    """Input tokens: the text's tokens; output tokens: the codec frames generated."""
    input_tokens = len(synth.engine.models.tokenizer.encode(text))
    output_tokens = math.ceil(stats.audio_s * synth.engine.models.codec.config.frame_rate)
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}

