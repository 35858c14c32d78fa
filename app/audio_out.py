"""Turn engine audio into HTTP responses: whole files, or byte streams as chunks arrive.

Encoding itself lives in engine.audio; this module only picks headers and the streaming framing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import numpy as np
from starlette.responses import Response, StreamingResponse

from engine.audio import MIME_TYPES, to_pcm16_bytes, wav_stream_header

from .errors import HTTPProblem

# Formats whose bytes can be sent as each chunk is produced: a WAV header with open length
# fields followed by 16-bit PCM, or bare PCM. Compressed containers are sent whole.
STREAMING_FORMATS = ("wav", "pcm")


def check_streamable(fmt: str):
    if fmt not in STREAMING_FORMATS:
        raise HTTPProblem(
            400,
            f"streaming supports the formats {', '.join(STREAMING_FORMATS)}; got {fmt!r}. "
            "Ask for one of those, or turn streaming off.",
        )


def _headers(fmt: str, sample_rate: int) -> dict[str, str]:
    # Raw PCM carries no header, so say what it is.
    return {
        "Content-Disposition": f"attachment; filename=audio.{fmt}",
        "X-Sample-Rate": str(sample_rate),
        "X-Audio-Format": "s16le mono" if fmt in ("pcm", "wav") else fmt,
    }


def audio_response(data: bytes, sample_rate: int, fmt: str) -> Response:
    """data: a whole file in `fmt` (engine.audio.encode_audio, on a thread of its own)."""
    return Response(data, media_type=MIME_TYPES[fmt], headers=_headers(fmt, sample_rate))


def pcm16_chunks(chunks: Iterator[np.ndarray]) -> Iterator[bytes]:
    """Each float chunk as 16-bit PCM bytes, converted on the thread that reads the engine rather than
    on the event loop, which every stream's bytes and every request's body pass through. Closing this
    closes `chunks` (that cancels the request in the engine)."""
    try:
        for chunk in chunks:
            yield to_pcm16_bytes(chunk)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def streaming_audio_response(chunks: AsyncIterator[bytes], sample_rate: int, fmt: str) -> StreamingResponse:
    """chunks: PCM bytes (pcm16_chunks)."""
    async def body():
        if fmt == "wav":
            yield wav_stream_header(sample_rate)
        async for chunk in chunks:
            yield chunk

    return StreamingResponse(body(), media_type=MIME_TYPES[fmt], headers=_headers(fmt, sample_rate))
