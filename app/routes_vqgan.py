"""fish-speech's codec routes: POST /v1/vqgan/encode (audio files -> codes) and /v1/vqgan/decode
(codes -> float16 PCM), with fish-speech's bodies and msgpack answers (JSON when asked for, audio
then base64-encoded)."""

from __future__ import annotations

import asyncio
import base64
from functools import partial

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from engine.errors import InputError

from .api_schema import AudioBytes
from .body import JSON, MSGPACK, read_body
from .bridge import call_in_thread
from .errors import error_responses
from .negotiation import documented, negotiated, wants_json
from .openapi import request_body

MAX_ITEMS = 16  # files or code sets per request
# A decode body's limit: 16 sets of 10 codebooks x 4,096 frames are ~3.3 MB of JSON, and parsed, a
# body of ints takes ~20x its bytes.
MAX_DECODE_BODY = 8 * 2**20


class VQGANEncodeRequest(BaseModel):
    audios: list[AudioBytes] = Field(
        min_length=1, max_length=MAX_ITEMS, description="Audio files (wav, mp3, flac, ...); base64 in JSON bodies."
    )


class VQGANDecodeRequest(BaseModel):
    tokens: list[list[list[int]]] = Field(
        min_length=1, max_length=MAX_ITEMS, description="Code sets, each (num_codebooks, frames), as /encode gives."
    )


def build_router(engine) -> APIRouter:
    router = APIRouter(prefix="/v1/vqgan", tags=["codec"])

    @router.post(
        "/encode",
        summary="Audio files to codec codes",
        openapi_extra=request_body(VQGANEncodeRequest, (JSON, MSGPACK)),
        responses={**documented(description="{tokens}: msgpack, or JSON when asked for"),
                   **error_responses(400, 413, 415, 422)},
    )
    async def encode(request: Request):
        """Answers `{"tokens": [[[int]]]}`: per file, one row of codes per codebook (~21.5 frames per second)."""
        req = await read_body(request, VQGANEncodeRequest)
        # Handed to the engine together, so that the new clips share the encoder's batched passes.
        codes = await asyncio.gather(*(call_in_thread(partial(engine.encode_codes, audio)) for audio in req.audios))
        tokens = [c.tolist() for c in codes]
        return negotiated(request, {"tokens": tokens})

    @router.post(
        "/decode",
        summary="Codec codes to audio (float16 PCM)",
        openapi_extra=request_body(VQGANDecodeRequest, (JSON, MSGPACK)),
        responses={**documented(description="{audios}: msgpack, or JSON (base64 audio) when asked for"),
                   **error_responses(400, 413, 415, 422)},
    )
    async def decode(request: Request):
        """Answers `{"audios": [bytes]}`: per code set, mono float16 little-endian samples at 44.1 kHz
        (base64 in JSON answers)."""
        req = await read_body(request, VQGANDecodeRequest, max_bytes=MAX_DECODE_BODY)
        audios = []
        for codes in req.tokens:
            samples = await call_in_thread(lambda: engine.decode_codes(_rectangular(codes)))
            audios.append(samples.astype("<f2").tobytes())
        if wants_json(request):
            audios = [base64.b64encode(a).decode("ascii") for a in audios]
        return negotiated(request, {"audios": audios})

    return router


def _rectangular(codes: list[list[int]]) -> np.ndarray:
    if len({len(row) for row in codes}) > 1:
        raise InputError("every codebook's row of codes must have the same length")
    try:
        return np.asarray(codes, dtype=np.int64)
    except OverflowError:
        raise InputError("a code is far out of range: each codebook's codes lie between 0 and its size - 1") from None
