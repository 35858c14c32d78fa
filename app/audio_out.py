"""Turn a synthesis into HTTP responses: a whole file, or bytes streamed as the engine produces them.

Speed, volume, sample rate and encoding live in engine.audio_stream; this module runs them off the
event loop and picks the headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from engine.audio import MIME_TYPES
from engine.audio_stream import OutputSpec, encode_stream, encode_whole

from .bridge import first_then_rest, iterate_in_thread
from .service import StreamStats, Synthesizer, Voice


def audio_headers(fmt: str, sample_rate: int) -> dict[str, str]:
    # Raw PCM carries no header, so say what it is.
    return {
        "Content-Disposition": f"attachment; filename=audio.{fmt}",
        "X-Sample-Rate": str(sample_rate),
        "X-Audio-Format": "s16le mono" if fmt in ("pcm", "wav") else fmt,
    }


async def whole_audio(synth: Synthesizer, text: str, voice: Voice, params, spec: OutputSpec) -> Response:
    def render():
        result = synth.synthesize(text, voice, params)
        return encode_whole(result.audio, result.sample_rate, spec)

    data, rate = await run_in_threadpool(render)
    return Response(data, media_type=MIME_TYPES[spec.format], headers=audio_headers(spec.format, rate))


async def audio_bytes(
    synth: Synthesizer, text: str, voice: Voice, params, spec: OutputSpec, stats: StreamStats | None = None
) -> AsyncIterator[bytes]:
    """The encoded stream, read on a stream thread. Returns once the first bytes are there, so that
    an input error still becomes a 4xx before any byte is sent."""
    stats = stats or StreamStats(synth.sample_rate)
    return await first_then_rest(
        iterate_in_thread(lambda: encode_stream(synth.stream(text, voice, params, stats), synth.sample_rate, spec))
    )


async def streamed_audio(synth: Synthesizer, text: str, voice: Voice, params, spec: OutputSpec) -> StreamingResponse:
    chunks = await audio_bytes(synth, text, voice, params, spec)
    rate = spec.rate(synth.sample_rate)
    return StreamingResponse(chunks, media_type=MIME_TYPES[spec.format], headers=audio_headers(spec.format, rate))
