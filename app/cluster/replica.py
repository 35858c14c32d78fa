"""EngineReplica: one TTSEngine per Serve replica (one per GPU: Ray sets CUDA_VISIBLE_DEVICES).

The ingress calls it through a DeploymentHandle: `stream` yields float32 chunks as the engine makes
them (Serve streams them back one by one), `synthesize` answers whole. Engine errors travel back
to the ingress as they are (QueueFullError becomes its 429 there). The replica reports its slots
and engine statistics to the routers (record_routing_stats), which route by voice with them and
which the ingress's /ready and /metrics read.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from loguru import logger
from ray import serve

from engine.config import EngineConfig
from engine.facade import ReferenceInput, SynthesisResult, TTSEngine
from engine.params import SamplingParams

from ..bridge import STREAM_THREADS, iterate_in_thread

# Engine statistics a replica reports (numbers and short strings; nested dicts are flattened by the ingress).
REPORTED_STATS = ("device", "precision", "compile", "model", "queue_depth", "running", "slots", "slots_ready",
                  "capturing", "ready", "prefix_cache", "reference_cache", "frames_per_s", "memory_gb",
                  "peak_memory_gb", "requests_total", "errors_total", "frames_total", "audio_seconds_total")


class EngineReplica:
    def __init__(self, config: EngineConfig):
        replica = serve.get_replica_context().replica_id.unique_id
        logger.info("engine replica {} starting on {} (CUDA_VISIBLE_DEVICES={})", replica, socket.gethostname(),
                    os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
        self.engine = TTSEngine.from_config(config)
        self.engine.warmup()
        STREAM_THREADS.keep(self.engine.capacity)
        # Whole (non-streamed) requests wait on these threads: as many as the engine takes at once.
        self._calls = ThreadPoolExecutor(max_workers=self.engine.capacity, thread_name_prefix="s1-replica-call")
        stats = self.engine.stats()
        self.info_ = {"replica": replica, "host": socket.gethostname(), "pid": os.getpid(), "device": stats["device"],
                      "slots": self.engine.slots, "capacity": self.engine.capacity,
                      "sample_rate": self.engine.sample_rate}
        logger.info("engine replica {} ready: {} on {} with {} sequence slots", replica, stats["model"],
                    stats["device"], self.engine.slots)

    def record_replica_metadata(self) -> dict:
        return dict(self.info_)

    def record_routing_stats(self) -> dict:
        stats = self.engine.stats()
        return {**self.info_, **{name: stats.get(name) for name in REPORTED_STATS}}

    async def info(self, voice_key: str | None = None) -> dict:
        return dict(self.info_)

    async def synthesize(self, text: str, voice: str | None, references: list[ReferenceInput],
                         params: SamplingParams | None, voice_key: str | None = None) -> SynthesisResult:
        stop = threading.Event()  # set as the call ends: a cancelled call's request leaves the engine at its next step
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._calls,
                lambda: self.engine.synthesize(text, references=references, voice=voice, params=params, stop=stop))
        finally:
            stop.set()

    async def stream(self, text: str, voice: str | None, references: list[ReferenceInput],
                     params: SamplingParams | None, voice_key: str | None = None) -> AsyncIterator:
        """float32 chunks; a cancelled call (the client went away) closes the engine's stream, freeing its slot."""
        chunks = iterate_in_thread(
            lambda: self.engine.synthesize_stream(text, references=references, voice=voice, params=params))
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
