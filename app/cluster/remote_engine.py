"""RemoteEngine: what the web app needs of an engine, served by the engine replicas.

create_app takes it in place of a TTSEngine, so the cluster serves the very same routes as one
server. Its calls block (the routes run them on worker threads, as with the local engine) and
carry the request's voice key for the VoiceAffinityRouter. Errors come back as the engine raised
them; a replica lost mid-request becomes a 503 that says to send the request again, a cluster
whose queues are full a 429, both with Retry-After.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayError, RayTaskError
from ray.serve.exceptions import BackPressureError, RayServeException

from engine.errors import Cancelled, InputError, QueueFullError
from engine.facade import ReferenceInput, SynthesisResult
from engine.params import SamplingParams

from ..errors import HTTPProblem, retry_after
from .routing import VOICE_KEY_ARG, voice_key
from .status import ClusterView

REPLICA_LOST = ("the engine replica serving this request stopped; Ray Serve is replacing it. "
                "Send the request again")
REPLICA_LOST_RETRY_S = 5
CLUSTER_FULL_RETRY_S = 2  # Serve's back-pressure answer carries it (backpressure_config); this when it does not


class RemoteEngine:
    def __init__(self, handle, sample_rate: int, voices, view: ClusterView):
        self._handle = handle
        self.sample_rate = sample_rate
        self.voices = voices  # the shared voice store, read and written by the ingress itself
        self.view = view

    # The engine's status, summed over the running replicas (routes_system and Metrics read these).

    def stats(self) -> dict:
        return self.view.totals()

    @property
    def is_ready(self) -> bool:
        return bool(self.view.replicas())

    @property
    def slots(self) -> int:
        return self.view.totals()["slots"]

    @property
    def slots_ready(self) -> int:
        return self.view.totals()["slots_ready"]

    @property
    def capturing(self) -> bool:
        return self.view.totals()["capturing"]

    def synthesize(self, text: str, *, references: Sequence[ReferenceInput] = (), voice: str | None = None,
                   params: SamplingParams | None = None) -> SynthesisResult:
        response = self._call(self._handle.synthesize, text, references, voice, params)
        with translated_errors():
            return response.result()

    def synthesize_stream(self, text: str, *, references: Sequence[ReferenceInput] = (), voice: str | None = None,
                          params: SamplingParams | None = None, stats: dict | None = None) -> Iterator[np.ndarray]:
        """As TTSEngine.synthesize_stream, on a replica; `stats` stays empty (the replica logs the
        request's figures)."""
        chunks = self._call(self._handle.options(stream=True).stream, text, references, voice, params)
        try:
            with translated_errors():
                yield from chunks
        finally:
            cancel(chunks)  # the caller stopped early: the replica drops the request and frees its slot

    def synthesize_batch(self, texts: Sequence[str], *, references: Sequence[ReferenceInput] = (),
                         voice: str | None = None, params: SamplingParams | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         stop: threading.Event | None = None) -> list[SynthesisResult | Exception]:
        """Every item is its own request (the router spreads them); an item's input error is its own result.
        `stop`, set when the caller left, cancels the items not finished yet."""
        responses = [self._call(self._handle.synthesize, text, references, voice, params) for text in texts]
        results: list[SynthesisResult | Exception] = []
        for response in responses:
            if stop is not None and stop.is_set():
                cancel(response)
                results.append(Cancelled("the caller stopped waiting for this batch"))
                continue
            try:
                with translated_errors():
                    results.append(response.result())
            except InputError as exc:
                results.append(exc)
            if progress is not None:
                progress(len(results), len(texts))
        return results

    def _call(self, method, text, references, voice, params):
        references = list(references)
        key = voice_key(voice, [r.audio for r in references if isinstance(r.audio, (bytes, bytearray))])
        with translated_errors():
            return method.remote(text, voice, references, params, **{VOICE_KEY_ARG: key})


def cancel(response) -> None:
    """Cancel a handle call, best effort. Serve's cancel() first waits for the call's replica and raises
    again the error that kept it from getting one (back-pressure, no replica): that error has been
    answered already and nothing runs on a replica, so there is nothing to cancel."""
    try:
        response.cancel()
    except (RayServeException, RayError):
        pass


class translated_errors:
    """Ray's wrappers off: the engine's own exception, or an HTTP answer for a lost replica / full cluster."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        if isinstance(exc, RayTaskError) and isinstance(exc.cause, Exception):
            exc = exc.cause  # the deployment's own exception; Serve's back-pressure can come wrapped too
            if not isinstance(exc, BackPressureError):
                raise exc from None
        if isinstance(exc, BackPressureError):
            raise QueueFullError("every engine replica is busy and the cluster's queue is full; retry shortly",
                                 exc.retry_after_s or CLUSTER_FULL_RETRY_S) from None
        if isinstance(exc, (RayActorError, ActorDiedError, ActorUnavailableError)):
            raise HTTPProblem(503, REPLICA_LOST, retry_after(REPLICA_LOST_RETRY_S)) from None
        return False
