"""Prometheus metrics, one registry per app so several apps (tests) can live in one process.

Counters and histograms are fed by the routes and the UI as requests finish; gauges that describe
the engine (queue, running, memory, frames/s) are read from engine.stats() at scrape time.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

PREFIX = "s1mini"
_BYTES_PER_GB = 1e9  # engine.stats() reports decimal GB
# TTFA from a few ms (a data-center GPU) to tens of seconds (CPU, long queue).
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.08, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
_RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "Finished requests by route and HTTP status.", ["route", "status"], registry=r
        )
        self.errors = Counter(
            f"{PREFIX}_request_errors", "Failed requests by kind (client, busy, internal).", ["route", "kind"],
            registry=r,
        )
        self.ttfa = Histogram(
            f"{PREFIX}_time_to_first_audio_seconds", "Request start to first audio chunk.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.rtf = Histogram(
            f"{PREFIX}_real_time_factor", "Compute seconds per audio second (lower is faster).",
            buckets=_RTF_BUCKETS, registry=r,
        )
        self.audio_seconds = Counter(f"{PREFIX}_audio_seconds", "Audio produced, in seconds.", registry=r)
        self.queue_depth = Gauge(f"{PREFIX}_requests_waiting", "Requests waiting for the engine.", registry=r)
        self.running = Gauge(f"{PREFIX}_requests_running", "Requests the engine is generating.", registry=r)
        self.slots = Gauge(f"{PREFIX}_sequence_slots", "Sequences the engine decodes at once (KV slots).", registry=r)
        self.slots_ready = Gauge(f"{PREFIX}_sequence_slots_ready", "Sequences that can run at once now: reaches "
                                 "sequence_slots once the larger batches' graphs are captured after start-up.",
                                 registry=r)
        self.prefix_hits = Gauge(f"{PREFIX}_voice_prefix_hits", "Requests whose voice prefix KV was reused.",
                                 registry=r)
        self.encode_batches = Gauge(f"{PREFIX}_reference_encode_batches", "Encoder passes over new reference clips "
                                    "(several clips a pass when max_encode_batch is above 1).", registry=r)
        self.encoded_clips = Gauge(f"{PREFIX}_reference_clips_encoded", "New reference clips encoded.", registry=r)
        self.frames_per_s = Gauge(f"{PREFIX}_frames_per_second", "Decode speed of the last request.", registry=r)
        self.memory = Gauge(f"{PREFIX}_memory_bytes", "Accelerator memory in use.", registry=r)
        self.peak_memory = Gauge(f"{PREFIX}_peak_memory_bytes", "Peak accelerator memory.", registry=r)
        self.ready = Gauge(f"{PREFIX}_ready", "1 when the model is loaded and warm.", registry=r)
        self.build = Info(f"{PREFIX}_engine", "What the engine runs on.", registry=r)

    def observe_request(self, route: str, status: int, error_kind: str | None = None):
        self.requests.labels(route, str(status)).inc()
        if error_kind:
            self.errors.labels(route, error_kind).inc()

    def observe_synthesis(self, audio_s: float, total_s: float, ttfa_s: float | None):
        """A whole result at once."""
        self.observe_audio(audio_s)
        self.observe_timing(audio_s, total_s, ttfa_s)

    def observe_audio(self, audio_s: float):
        self.audio_seconds.inc(audio_s)

    def observe_timing(self, audio_s: float, total_s: float, ttfa_s: float | None):
        if ttfa_s is not None:
            self.ttfa.observe(ttfa_s)
        if audio_s > 0:
            self.rtf.observe(total_s / audio_s)

    def render(self, engine) -> tuple[bytes, str]:
        stats = engine.stats()
        self.queue_depth.set(stats.get("queue_depth") or 0)
        self.running.set(stats.get("running") or 0)
        self.slots.set(stats.get("slots") or 0)
        self.slots_ready.set(stats.get("slots_ready") or 0)
        self.prefix_hits.set((stats.get("prefix_cache") or {}).get("hits") or 0)
        encodes = stats.get("reference_encodes") or {}
        self.encode_batches.set(encodes.get("batches") or 0)
        self.encoded_clips.set(encodes.get("clips") or 0)
        self.frames_per_s.set(stats.get("frames_per_s") or 0)
        self.memory.set((stats.get("memory_gb") or 0) * _BYTES_PER_GB)
        self.peak_memory.set((stats.get("peak_memory_gb") or 0) * _BYTES_PER_GB)
        self.ready.set(1 if engine.is_ready else 0)
        self.build.info({k: str(stats.get(k, "")) for k in ("model", "device", "precision", "compile", "demo")})
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
