"""Turn a synthesis into HTTP responses: a whole file, or bytes streamed as the engine produces them.

Speed, volume, sample rate and encoding live in engine.audio_stream; this module runs them on the
engine's stream threads (never the event loop, never Starlette's shared pool) and picks the headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engine.audio import MIME_TYPES
from engine.audio_stream import OutputSpec, encode_stream, encode_whole

from .bridge import call_in_thread, first_then_rest, iterate_in_thread, until_disconnected
from .service import SpeechService, StreamStats, Voice

# A client that went away before its answer: nginx's code, logged and counted, never sent.
CLIENT_CLOSED_REQUEST = 499


def audio_headers(fmt: str, sample_rate: int) -> dict[str, str]:
    # Raw PCM carries no header, so say what it is.
    return {
        "Content-Disposition": f"attachment; filename=audio.{fmt}",
        "X-Sample-Rate": str(sample_rate),
        "X-Audio-Format": fmt,
    }


async def _collect(chunks: AsyncIterator[np.ndarray]) -> list[np.ndarray]:
    return [chunk async for chunk in chunks]


async def whole_audio(request: Request, synth: SpeechService, text: str, voice: Voice, params,
                      spec: OutputSpec) -> Response:
    """The whole file. Generated like a stream, so the engine's queue limit sheds it the same way (429)
    and a client that leaves frees its slot at the next step."""
    stats = StreamStats(synth.sample_rate)
    chunks = iterate_in_thread(lambda: synth.stream(text, voice, params, stats))
    connected, pieces = await until_disconnected(request.receive, _collect(chunks))
    if not connected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    data, rate = await call_in_thread(lambda: encode_whole(audio, synth.sample_rate, spec))
    return Response(data, media_type=MIME_TYPES[spec.format], headers=audio_headers(spec.format, rate))


async def audio_bytes(
    synth: SpeechService, text: str, voice: Voice, params, spec: OutputSpec, stats: StreamStats | None = None
) -> AsyncIterator[bytes]:
    """The encoded stream, read on a stream thread. Returns once the first bytes are there, so that
    an input error still becomes a 4xx before any byte is sent."""
    stats = stats or StreamStats(synth.sample_rate)
    return await first_then_rest(
        iterate_in_thread(lambda: encode_stream(synth.stream(text, voice, params, stats), synth.sample_rate, spec))
    )


async def streamed_audio(synth: SpeechService, text: str, voice: Voice, params, spec: OutputSpec) -> StreamingResponse:
    chunks = await audio_bytes(synth, text, voice, params, spec)
    rate = spec.rate(synth.sample_rate)
    return StreamingResponse(chunks, media_type=MIME_TYPES[spec.format], headers=audio_headers(spec.format, rate))
