"""Speech for the web layer: who speaks (Voice), the engine's synthesis calls with their timing and
metrics (SpeechService, StreamStats), and the HTTP responses they become, a whole file or bytes
streamed as the engine produces them.

SpeechService is synchronous and runs on worker threads (app.bridge's for the REST API, Gradio's for
the UI), never on the event loop. The response builders run it on the engine's stream threads (never
the event loop, never Starlette's shared pool), encode its audio with engine.audio_stream (speed,
volume, sample rate, encoding) and pick the headers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engine.audio import MIME_TYPES
from engine.audio_stream import OutputSpec, encode_stream, encode_whole
from engine.facade import ReferenceInput, SynthesisResult
from engine.params import SamplingParams

from .bridge import call_in_thread, first_then_rest, iterate_in_thread, until_disconnected
from .metrics import Metrics

# A client that went away before its answer: nginx's code, logged and counted, never sent.
CLIENT_CLOSED_REQUEST = 499


@dataclass
class StreamStats:
    """Filled in while a stream runs; complete once the generator is exhausted."""

    sample_rate: int
    samples: int = 0
    ttfa_s: float | None = None
    total_s: float = 0.0
    # The engine's stages until the first audio, ms (engine.facade.request_timeline), once it is
    # there; a cluster's replicas keep theirs in their logs.
    timeline_ms: dict[str, float] = field(default_factory=dict)

    @property
    def audio_s(self) -> float:
        return self.samples / self.sample_rate

    @property
    def rtf(self) -> float | None:
        return self.total_s / self.audio_s if self.samples else None


@dataclass(frozen=True)
class Voice:
    """Who speaks: a saved voice id, inline references, or neither (the model's own voice)."""

    voice_id: str | None = None
    references: tuple[ReferenceInput, ...] = ()

    @classmethod
    def of(cls, fields) -> "Voice":
        """The voice a request body names (api_schema.VoiceFields: reference_id, references)."""
        refs = tuple(ReferenceInput(audio=r.audio, text=r.text) for r in fields.references)
        return cls(voice_id=fields.reference_id or None, references=refs)

    def engine_kwargs(self) -> dict:
        # A saved voice wins over inline references, as in the reference server.
        if self.voice_id:
            return {"voice": self.voice_id, "references": []}
        return {"voice": None, "references": list(self.references)}


class SpeechService:
    """Speech for the web layer: the engine's synthesis calls, each one counted in the app's metrics."""

    def __init__(self, engine, metrics: Metrics):
        self.engine = engine
        self.metrics = metrics

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    @property
    def max_text_length(self) -> int:
        """Characters per request; 0 = no limit (or one this process does not know: a cluster's)."""
        return int(getattr(getattr(self.engine, "config", None), "max_text_length", 0) or 0)

    def synthesize(self, text: str, voice: Voice, params: SamplingParams) -> SynthesisResult:
        result = self.engine.synthesize(text, params=params, **voice.engine_kwargs())
        self._observe_result(result)
        return result

    def stream(self, text: str, voice: Voice, params: SamplingParams, stats: StreamStats) -> Iterator[np.ndarray]:
        """Yields float32 chunks; `stats` is updated as they come. The audio counter grows with each
        chunk, so it shows the work done, a request cut short included."""
        start = time.perf_counter()
        figures: dict = {}
        chunks = self.engine.synthesize_stream(text, params=params, stats=figures, **voice.engine_kwargs())
        try:
            for chunk in chunks:
                if stats.ttfa_s is None:
                    stats.ttfa_s = time.perf_counter() - start
                    stats.timeline_ms = dict(figures.get("timeline_ms") or {})
                stats.samples += len(chunk)
                stats.total_s = time.perf_counter() - start
                self.metrics.observe_audio(len(chunk) / stats.sample_rate)
                yield chunk
        finally:
            chunks.close()
        self.metrics.observe_timing(stats.audio_s, stats.total_s, stats.ttfa_s)

    def batch(
        self,
        texts: list[str],
        voice: Voice,
        params: SamplingParams,
        progress: Callable[[int, int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> list[SynthesisResult | Exception]:
        """stop: set when the caller left; the items not finished end with Cancelled."""
        results = self.engine.synthesize_batch(texts, params=params, progress=progress, stop=stop,
                                               **voice.engine_kwargs())
        for result in results:
            if isinstance(result, SynthesisResult):
                self._observe_result(result)
        return results

    def _observe_result(self, result: SynthesisResult):
        s = result.stats
        self.metrics.observe_synthesis(s.get("audio_s", 0.0), s.get("total_s", 0.0), s.get("ttfa_s"))


def audio_headers(fmt: str, sample_rate: int, stats: StreamStats | None = None) -> dict[str, str]:
    # Raw PCM carries no header, so say what it is.
    return {
        "Content-Disposition": f"attachment; filename=audio.{fmt}",
        "X-Sample-Rate": str(sample_rate),
        "X-Audio-Format": fmt,
        **timing_headers(stats),
    }


def timing_headers(stats: StreamStats | None) -> dict[str, str]:
    """The engine's stages until the first audio as a Server-Timing header (W3C; browsers' developer
    tools show it): where a request's time to first audio went, in ms, stage after stage. None
    before the first audio, or from a cluster."""
    if stats is None or not stats.timeline_ms:
        return {}
    return {"Server-Timing": ", ".join(f"{stage};dur={ms:.1f}" for stage, ms in stats.timeline_ms.items())}


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
    return Response(data, media_type=MIME_TYPES[spec.format], headers=audio_headers(spec.format, rate, stats))


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
    stats = StreamStats(synth.sample_rate)
    chunks = await audio_bytes(synth, text, voice, params, spec, stats)  # the first audio is there
    rate = spec.rate(synth.sample_rate)
    return StreamingResponse(chunks, media_type=MIME_TYPES[spec.format],
                             headers=audio_headers(spec.format, rate, stats))
