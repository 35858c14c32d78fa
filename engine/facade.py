"""TTSEngine: the engine's public face. Load once, then synthesize from any thread.

Validation happens here, in the caller's thread, so bad input never reaches the GPU worker.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from loguru import logger

from . import compilation
from .audio import load_audio
from .compile_helpers import CompileHelpers
from .config import EngineConfig
from .core import MIN_GENERATION_ROOM, EngineCore
from .device import memory_gb, slots_that_fit
from .errors import Cancelled, InputError, VoiceNotFoundError
from .loader import LoadedModels, load_models
from .params import SamplingParams
from .references import DecodedClips, ReferenceCodeCache, default_cache_dir, default_voices_dir
from .request import AudioChunk, PreparedRequest, ReferenceClip
from .runtime.kv_cache import bytes_per_slot
from .runtime.worker import GPUWorker
from .text.prompt import text_part, voice_prefix
from .text.splitter import split_text
from .voice_store import VoiceStore

WARMUP_TEXT = "Hello world."


@dataclass(frozen=True)
class ReferenceInput:
    """A reference voice clip and its transcript. audio: file bytes, a path, or (sample_rate, samples)."""

    audio: bytes | str | os.PathLike | tuple
    text: str


@dataclass
class SynthesisResult:
    sample_rate: int
    audio: np.ndarray  # float32 mono
    stats: dict = field(default_factory=dict)  # audio_s, total_s, ttfa_s, rtf, frames, timeline_ms


# A request's stages, each timed from the one before (see request_timeline).
TIMELINE_STAGES = ("prepared", "started", "voice_ready", "first_frames", "first_audio")


def request_timeline(called: float, submitted: float, marks: dict[str, float], ttfa_s: float | None) -> dict[str, float]:
    """Milliseconds each stage a request reached took after the one before: prepared (text split,
    reference audio read, on the caller's thread), started (waiting for the GPU worker),
    voice_ready (reference clips encoded or found cached), first_frames (admission, prefill and the
    first decode steps), first_audio (the codec, until the caller received audio)."""
    times = {"prepared": submitted, **marks}
    if ttfa_s is not None:
        times["first_audio"] = submitted + ttfa_s
    timeline, previous = {}, called
    for stage in TIMELINE_STAGES:
        if stage in times:
            timeline[stage] = (times[stage] - previous) * 1000
            previous = times[stage]
    return timeline


class TTSEngine:
    def __init__(self, config: EngineConfig, models: LoadedModels):
        self.config = config
        self.models = models
        cache_dir = default_cache_dir(config.cache_dir)
        self.reference_cache = ReferenceCodeCache(cache_dir / "reference-codes", fingerprint=models.fingerprint)
        self._decoded_clips = DecodedClips(self._decode_clip)
        self.policy = compilation.decide(config.compile, models.placement.device, compile_mode=config.compile_mode,
                                          quantize=config.quantize, fused_projections=config.fused_projections)
        if self.policy.compile:
            compilation.configure_caches(cache_dir / "compile")
        c = models.model.config
        capacity = min(c.max_seq_len, config.max_context or c.max_seq_len)
        self.slots, slots_reason = slots_that_fit(
            config.max_batch_size,
            bytes_per_slot(c.n_layer, c.n_local_heads, capacity, c.head_dim, models.placement.dtype),
            models.placement.device)
        self._core = EngineCore(config, models, self.reference_cache, self.policy, slots=self.slots,
                                capacity=capacity)
        if config.switch_interval_ms:
            sys.setswitchinterval(config.switch_interval_ms / 1000)
        self.voices = VoiceStore(default_voices_dir(config.voices_dir), max_seconds=config.max_reference_seconds,
                                 check_voice=self._check_voice_fits)
        self._worker = GPUWorker(self.slots + config.max_queue, step=self._core.step,
                                 on_start=self._core.set_stream_priority)
        self._stats_lock = threading.Lock()
        self._counters = {"requests_total": 0, "errors_total": 0, "frames_total": 0, "audio_seconds_total": 0.0}
        self._last_frames_per_s: float | None = None
        self.is_ready = False
        self._helpers = CompileHelpers()  # none until a first start's prepare() starts them
        logger.info("engine loaded: {} on {} ({}); decode: {}; {} concurrent sequences ({}; KV slots of {} positions); "
                    "cache dir {}; voices {}", models.description, models.placement.device, models.placement.reason,
                    self.policy.describe(), self.slots, slots_reason, capacity, cache_dir, self.voices.root)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "TTSEngine":
        return cls(config, load_models(config))

    @property
    def sample_rate(self) -> int:
        return self._core.sample_rate

    # ---- synthesis ----------------------------------------------------------------------------

    def synthesize_stream(self, text: str, *, references: Sequence[ReferenceInput] = (), voice: str | None = None,
                          params: SamplingParams | None = None, stats: dict | None = None) -> Iterator[np.ndarray]:
        """Yield float32 audio chunks as they are produced (one per text chunk). `stats`, when given,
        gets the request's figures as the stream ends, as SynthesisResult.stats has them; its
        `timeline_ms` (request_timeline: the stages until the first audio) and `ttfa_s` are there
        before the first chunk is yielded."""
        for chunk in self._stream_chunks(text, references, voice, params, stats={} if stats is None else stats):
            yield chunk.samples

    def synthesize(self, text: str, *, references: Sequence[ReferenceInput] = (), voice: str | None = None,
                   params: SamplingParams | None = None, stop: threading.Event | None = None) -> SynthesisResult:
        """The whole clip. `stop`, set from another thread, drops the request at its next piece of
        audio (its slot is freed) and raises Cancelled."""
        stats: dict = {}
        pieces = []
        chunks = self._stream_chunks(text, references, voice, params, stats)
        try:
            for chunk in chunks:
                if stop is not None and stop.is_set():
                    raise Cancelled("the caller stopped waiting for this request")
                pieces.append(chunk.samples)
        finally:
            chunks.close()  # cancels the request in the engine when it did not run to its end
        audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return SynthesisResult(self.sample_rate, audio, stats)

    def synthesize_batch(self, texts: Sequence[str], *, references: Sequence[ReferenceInput] = (),
                         voice: str | None = None, params: SamplingParams | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         stop: threading.Event | None = None) -> list[SynthesisResult | Exception]:
        """Every item gets a result or its own error; one bad item never fails the others.

        Items run concurrently on the scheduler, at most one per KV slot at a time from this call.
        `stop`, set from another thread (the caller left), ends every item that has not finished
        with Cancelled."""
        results: list[SynthesisResult | Exception | None] = [None] * len(texts)
        done = 0
        lock = threading.Lock()

        def run(index: int) -> None:
            nonlocal done
            try:
                if stop is not None and stop.is_set():
                    raise Cancelled("the caller stopped waiting for this batch")
                results[index] = self.synthesize(texts[index], references=references, voice=voice, params=params,
                                                 stop=stop)
            except (InputError, Cancelled) as exc:
                results[index] = exc
            with lock:
                done += 1
                if progress is not None:
                    progress(done, len(texts))

        with ThreadPoolExecutor(max_workers=max(1, min(self.slots, len(texts))), thread_name_prefix="s1-batch") as pool:
            for future in [pool.submit(run, i) for i in range(len(texts))]:
                future.result()  # re-raises what is not the item's own fault (e.g. the engine is closed)
        return results

    # ---- codec: audio <-> codes (fish-speech's /v1/vqgan routes) -------------------------------

    def encode_codes(self, audio) -> np.ndarray:
        """An audio file's codec codes, (num_codebooks, frames) int: the reference encoder's, cached by
        content like every reference clip's."""
        samples, key = self._decoded_clips.get(audio)
        codes = self.reference_cache.cached_copy(key)
        if codes is None:  # waited for here: the worker goes on stepping the running requests
            clip = ReferenceClip(samples, transcript="", key=key)
            codes = self._worker.first_result(lambda job: self._core.encode(clip, job))
        return codes.numpy()

    def decode_codes(self, codes) -> np.ndarray:
        """Float32 audio at sample_rate of (num_codebooks, frames) codec codes."""
        codec = self.models.codec
        config = codec.config
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != config.num_codebooks or codes.shape[1] == 0:
            raise InputError(f"codes must be {config.num_codebooks} rows of equal length (one per codebook) with at "
                             f"least one frame, got shape {codes.shape}")
        limits = [config.semantic_codebook_size] + [config.residual_codebook_size] * (config.num_codebooks - 1)
        for row, limit in enumerate(limits):
            if codes[row].min() < 0 or codes[row].max() >= limit:
                raise InputError(f"codebook {row}'s codes must be in 0..{limit - 1}")
        limit = self._core.capacity
        if codes.shape[1] > limit:
            raise InputError(f"{codes.shape[1]} frames is over this server's limit of {limit}; decode fewer at a time")
        tensor = torch.from_numpy(codes.astype(np.int64))[None]

        def decode():
            with torch.inference_mode():
                return codec.decode(tensor.to(self.models.placement.device))[0, 0].float().cpu().numpy()

        return self._worker.call(decode)

    def prepare(self) -> float:
        """Compile and capture what one running request needs (on the worker thread, which owns
        every graph); the reference encoder's graphs and those of larger batches follow while the
        worker has nothing else to do, or when more requests arrive than can run (see Scheduler and
        GraphCapture). On a first start, helper processes compile parts of the graphs meanwhile
        (compile_helpers). Returns the seconds it took."""
        if self.policy.compile and self.policy.cuda_graphs:
            self._helpers = CompileHelpers.start(self.config, self.models.placement.device)

        def prepare_then_capture_more() -> float:
            seconds = self._core.prepare(self._helpers)
            self._worker.when_idle(self._core.capture_more)
            return seconds

        return self._worker.call(prepare_then_capture_more)

    def prepare_part(self, part: str) -> float:
        """A compile helper's work (compile_helper_process.run_part): compile one part's regions."""
        return self._worker.call(lambda: self._core.graphs.prepare_part(part))

    def warmup(self) -> None:
        """prepare(), then one short request end to end: the engine is ready."""
        started = time.perf_counter()
        self.prepare()
        self.synthesize(WARMUP_TEXT, params=SamplingParams(max_new_tokens=32, seed=0))
        self.is_ready = True
        logger.info("warm-up done in {:.1f} s", time.perf_counter() - started)

    def capture_all(self, timeout_s: float = 1800.0) -> float:
        """Capture every remaining graph now, as soon as no request is in flight (benchmarks,
        tests); returns the seconds it took."""
        started = time.perf_counter()
        while self._core.graphs.pending:
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"the engine stayed busy for {timeout_s:.0f} s: its remaining graphs "
                                   "(larger batches, reference encoder) were not captured")
            if self._worker.in_flight == 0 and self._worker.call(lambda: self._core.capture_more(self.slots)):
                continue
            time.sleep(0.01)  # requests still running, or their last step's read-back: try again
        return time.perf_counter() - started

    @property
    def capacity(self) -> int:
        """Requests taken at once, running or waiting (slots + max_queue); beyond it QueueFullError."""
        return self._worker.capacity

    @property
    def slots_ready(self) -> int:
        """Sequences that can run at once now (reaches `slots` once every batch's graphs are captured)."""
        return min(self._core.runner.ready_slots, self.slots)

    @property
    def in_flight(self) -> int:
        """Requests (and set-up calls) accepted and not finished."""
        return self._worker.in_flight

    @property
    def capturing(self) -> bool:
        """Graphs are still to be captured: larger batches', the reference encoder's (False once all
        are, or after a failed capture)."""
        return self._core.graphs.pending

    def _stream_chunks(self, text, references, voice, params, stats: dict) -> Iterator[AudioChunk]:
        called = time.perf_counter()
        request = self._prepare(text, references, voice, params)
        started = time.perf_counter()
        job = self._worker.submit(lambda j: self._core.start(request, j))
        frames, samples = 0, 0
        timeline = None  # from the first audio on (job marks are first-time only: it then stands)
        try:
            for chunk in job.results():
                frames += chunk.frames
                if not len(chunk.samples):
                    continue
                if not samples:
                    stats["ttfa_s"] = time.perf_counter() - started
                    stats["timeline_ms"] = timeline = request_timeline(called, started, job.marks, stats["ttfa_s"])
                samples += chunk.samples.shape[0]
                yield chunk
        except Exception:
            self._count(errors_total=1)
            raise
        total = time.perf_counter() - started
        audio_s = samples / self.sample_rate
        stats.update(frames=frames, audio_s=audio_s, total_s=total, rtf=total / audio_s if audio_s else None,
                     frames_per_s=frames / total if total else None, seed=request.seed)
        self._last_frames_per_s = stats["frames_per_s"]
        self._count(requests_total=1, frames_total=frames, audio_seconds_total=audio_s)
        if timeline is None:  # no audio: the stages the request reached
            stats["timeline_ms"] = timeline = request_timeline(called, started, job.marks, None)
        logger.info("request: {:.1f} s of audio in {:.2f} s; {}", audio_s, total,
                    ", ".join(f"{stage} {ms:.0f} ms" for stage, ms in timeline.items()))

    def _prepare(self, text, references, voice, params) -> PreparedRequest:
        params = params or SamplingParams()
        if not isinstance(text, str) or not _has_words(text):
            raise InputError("text is empty: give the words to speak")
        limit = self.config.max_text_length
        if limit and len(text) > limit:
            raise InputError(f"text is {len(text)} characters, over this server's limit of {limit}; "
                             "split it into several requests")
        refs = [self._load_reference(r.audio, r.text, f"reference {i + 1}") for i, r in enumerate(references)]
        if voice:
            refs.append(self._saved_voice(voice))
        seed = params.seed if params.seed is not None else (
            self.config.seed if self.config.seed is not None else secrets.randbits(31))
        chunks = split_text(text, params.chunk_length)
        # Tokenized here, on the caller's thread: the GPU worker's time is every request's.
        model = self.models
        parts = [text_part(model.tokenizer, chunk, model.model.config.num_codebooks) for chunk in chunks]
        return PreparedRequest(chunks, parts, refs, params, seed)

    def _saved_voice(self, voice: str) -> ReferenceClip:
        audio_path, transcript = self.voices.get(voice)
        try:
            return self._load_reference(audio_path, transcript, f"voice {voice!r}")
        except InputError:
            if not audio_path.is_file():  # deleted or renamed since it was looked up
                raise VoiceNotFoundError(self.voices.not_found_message(voice)) from None
            raise

    def _check_voice_fits(self, samples: np.ndarray, transcript: str) -> None:
        """InputError for a voice whose prompt (its transcript and clip, plus one word of text)
        leaves the model no room to speak: every request with it would fail."""
        model = self.models
        n = model.model.config.num_codebooks
        frames = math.ceil(len(samples) / self.sample_rate * model.codec.config.frame_rate)
        codes = torch.zeros(n, max(frames, 1), dtype=torch.long)
        prefix = voice_prefix(model.tokenizer, [(transcript, codes)], n)
        length = prefix.shape[1] + text_part(model.tokenizer, "a", n).shape[1]
        limit = self._core.capacity - MIN_GENERATION_ROOM
        if length > limit:
            raise InputError(f"this voice's prompt (transcript and clip) is {length} positions long, over this "
                             f"model's limit of {limit}; use a shorter transcript and clip")

    def _load_reference(self, audio, transcript: str, label: str) -> ReferenceClip:
        if not isinstance(transcript, str) or not transcript.strip():
            raise InputError(f"{label} has no transcript: give the exact words spoken in the reference audio")
        samples, key = self._decoded_clips.get(audio)
        return ReferenceClip(samples, transcript.strip(), key)

    def _decode_clip(self, audio) -> tuple[np.ndarray, str]:
        samples = load_audio(audio, max_seconds=self.config.max_reference_seconds)
        return samples, self.reference_cache.key(samples)

    # ---- status -------------------------------------------------------------------------------

    def _count(self, **increments) -> None:
        with self._stats_lock:
            for key, value in increments.items():
                self._counters[key] += value

    def stats(self) -> dict:
        placement = self.models.placement
        scheduler = self._core.scheduler
        allocated, peak = memory_gb(placement.device)
        with self._stats_lock:
            counters = dict(self._counters)
        return {
            "model": self.models.description,
            "demo": self.models.random_weights,
            "device": str(placement.device),
            "precision": placement.precision,
            "compile": self.policy.describe(),
            "memory_gb": allocated,
            "peak_memory_gb": peak,
            "queue_depth": max(self._worker.in_flight - scheduler.running, 0),
            "running": scheduler.running,
            "slots": self.slots,
            "slots_ready": self.slots_ready,
            "capturing": self.capturing,
            "prefix_cache": self._core.prefix_cache.stats(),
            "frames_per_s": self._last_frames_per_s,
            "ready": self.is_ready,
            "reference_cache": self.reference_cache.stats(),
            "reference_encodes": {"batches": self._core.clip_encodes.batches, "clips": self._core.clip_encodes.clips},
            **counters,
        }

    def close(self) -> None:
        self._helpers.close()
        self._worker.close()


def _has_words(text: str) -> bool:
    """Anything to speak: more than spaces and invisible format characters (zero-width space, BOM)."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc") for ch in text)
