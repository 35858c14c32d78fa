"""Requests on the GPU worker: reference codes, prompts per text chunk, frames, audio.

Long text is split into chunks at sentence boundaries and generated in order. Every chunk is
prompted with the same voice: the given references, or, without any, the first chunk's own
output as the reference for the rest (so an unprompted voice stays the same across chunks).
Each chunk is one sequence for the scheduler, which runs the sequences of all requests together;
their frames are decoded to audio together as they arrive, by a streaming codec decoder whose
output equals a whole-chunk decode. Chunks are joined with short fades so that no click appears
at a seam.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from loguru import logger

from .compilation import CompilePolicy
from .errors import InputError
from .loader import LoadedModels
from .params import SamplingParams
from .references import ReferenceCodeCache
from .runtime.codec_runner import CodecRunner, set_up_codec
from .runtime.kv_cache import KVCache
from .runtime.prefix_cache import PrefixCache
from .runtime.reference_encoder import EncodeHandle, ReferenceEncoder
from .runtime.scheduler import Scheduler, SequenceSpec
from .runtime.step_runner import StepRunner
from .runtime.worker import Job
from .text.prompt import voice_prefix

# Prompts must leave this much context for generation (the reference demands 2048 of its 8192).
MIN_GENERATION_ROOM = 1024
SEAM_FADE_SECONDS = 0.01
REFERENCE_CHUNK_FRAMES = 32  # ~1.5 s of reference audio at a time: on an H100, 0.1 GB less peak than 64 for 9 ms more per 10 s
# Clips up to this long encode through the chunk graph, whose RoPE tables are sized for them up front
# (~95 s; a raised max_reference_seconds makes longer clips encode eagerly instead of growing the tables).
GRAPHED_REFERENCE_FRAMES = 2048
# Reference clips encoding on the GPU at once: a 10 s clip is ~50 ms of GPU work and a few hundred
# graph launches; a burst of new voices queued at once filled the GPU's command buffer, after which
# every launch, the decode steps' too, waited ~50 ms per clip for the encodes to drain (H100:
# docs/PERFORMANCE.md). One at a time leaves the encoder idle between clips (the next starts when the
# worker sees the last one finish), but two at once took more of the GPU from the running streams:
# over HTTP on an H100, 27 of 64 and 55 of 128 listeners ran dry (by up to 0.06 s) in the bursts with
# new voices, none with one (which gave 5-9% less audio per second in those bursts).
ENCODES_IN_FLIGHT = 1
ENCODE_POLL_S = 0.001  # how often an otherwise idle worker checks whether an encode has finished
# Voice prompts (prefix columns and key) kept by their clips: building one is ~50 tensor operations,
# each of which waits for the GIL beside a busy event loop (a request's set-up on the GPU worker took
# up to ~90 ms in a burst over HTTP on an H100: docs/PERFORMANCE.md). ~13 KB each for a 10 s clip.
VOICE_PROMPTS_KEPT = 256


@dataclass(frozen=True)
class ReferenceClip:
    samples: np.ndarray  # 44.1 kHz mono
    transcript: str
    key: str  # ReferenceCodeCache.key(samples), hashed on the caller's thread, not the GPU worker's


@dataclass
class PreparedRequest:
    chunks: list[str]
    text_parts: list[torch.Tensor]  # each chunk's prompt columns (text_part), built on the caller's thread
    references: list[ReferenceClip]
    params: SamplingParams
    seed: int


@dataclass
class AudioChunk:
    samples: np.ndarray  # float32 mono
    frames: int
    text_chunk: int


class ClipEncode:
    """One reference clip's encode: waiting for its turn until `start`, then running on the GPU."""

    def __init__(self, samples: np.ndarray):
        self.samples: np.ndarray | None = samples
        self.handle: EncodeHandle | None = None
        self.error: Exception | None = None

    @property
    def started(self) -> bool:
        return self.handle is not None or self.error is not None

    def start(self, encoder: ReferenceEncoder) -> None:
        try:
            self.handle = encoder.start(self.samples)
        except Exception as exc:  # the requests waiting for this clip fail with it (RequestRun.try_start)
            self.error = exc
        self.samples = None

    def ready(self) -> bool:
        return self.error is not None or (self.handle is not None and self.handle.ready())

    def result(self) -> torch.Tensor:
        """The clip's codes; raises the encode's error. Only once ready()."""
        if self.error is not None:
            raise self.error
        return self.handle.result()


class Synthesizer:
    def __init__(self, models: LoadedModels, reference_cache: ReferenceCodeCache, policy: CompilePolicy,
                 exact_sampling: bool, capacity: int, slots: int, prefix_cache_bytes: int, reference_frames: int,
                 decode_priority: bool = True, **admission):
        """capacity: KV positions per sequence; slots: sequences decoded at once; reference_frames:
        the longest reference clip, in codec frames; decode_priority: see claim_thread; admission:
        the Scheduler's read_back_lag, admit_gather_steps and admit_min_lead_s."""
        self.models = models
        self.decode_priority = decode_priority
        self.reference_cache = reference_cache
        c = models.model.config
        self.capacity = capacity
        cache = KVCache(c.n_layer, slots, c.n_local_heads, self.capacity, c.head_dim,
                        models.placement.dtype, models.placement.device)
        self.runner = StepRunner(models.model, cache, policy, exact_vocab=exact_sampling)
        if not exact_sampling:
            # The runner's head copied the 4,097 rows it samples codebook 0 from; nothing else reads
            # the other 151,679 rows of the output matrix (310 MB in bf16 at full size): free them.
            models.model.release_output_()
        self.prefix_cache = PrefixCache(cache, prefix_cache_bytes)
        self.scheduler = Scheduler(self.runner, self.prefix_cache, frame_rate=models.codec.config.frame_rate,
                                   **admission)
        set_up_codec(models.codec, policy)
        self.codec_runner = CodecRunner(models.codec, slots, self.capacity)
        self.reference_encoder = ReferenceEncoder(models.codec, REFERENCE_CHUNK_FRAMES,
                                                  min(reference_frames, GRAPHED_REFERENCE_FRAMES))
        self._encoding: dict[str, ClipEncode] = {}  # reference clips being encoded or waiting to, by cache key
        self._voice_prompts: OrderedDict[tuple, tuple[torch.Tensor, str]] = OrderedDict()  # see voice_prompt
        self._awaiting_voice: list[RequestRun] = []  # requests waiting for their clips' codes

    @property
    def sample_rate(self) -> int:
        return self.models.codec.config.sample_rate

    def claim_thread(self) -> None:
        """On the worker thread, before its first GPU work: on CUDA, make a high-priority stream its
        current one (the stream is per thread), if decode_priority is on.

        The thread's eager work (the prefill of admitted requests, copies) then outranks the codec
        chunks and reference encodes, which run on streams of the lowest priority: whenever SMs
        free up, the block scheduler starts its kernels before more blocks of a codec kernel. CUDA
        graphs keep the priority of the stream they were captured on (torch >= 2.10 instantiates
        them with node priorities), so the step runner captures its graphs at the current stream's
        priority: the decode steps outrank the codec's graphs too (64 streams in process on an
        H100, one machine: 372-377 audio-s/s off, 379-394 on; docs/PERFORMANCE.md)."""
        device = self.models.placement.device
        if device.type != "cuda" or not self.decode_priority:
            return
        stream = torch.cuda.Stream(device, priority=torch.cuda.Stream.priority_range()[1])
        stream.wait_stream(torch.cuda.default_stream(device))  # weights made on other threads' default stream
        torch.cuda.set_stream(stream)
        logger.info("decode steps run on a CUDA stream of priority {} (codec and encodes: {})",
                    stream.priority, torch.cuda.Stream.priority_range()[0])

    def prepare(self) -> float:
        """On the worker thread, before any request: compile, and capture the graphs of one running
        sequence (decode step, codec, reference encoder) and the codec's of two; the larger batches
        follow as `capture_more` captures them. Returns the seconds it took."""
        seconds = self.runner.prepare([1])
        if self.runner.policy.cuda_graphs:
            # The codec's graphs of two rows too: their capture compiles the post-transformer's
            # graph for every row count above one (set_up_codec), which would otherwise happen at the
            # first larger batch's capture, while requests wait.
            seconds += self.codec_runner.prepare(min(2, self.codec_runner.rows)) + self.reference_encoder.prepare()
        return seconds

    def capture_more(self, up_to: int = 0) -> bool:
        """Capture the next batch bucket's codec and step graphs, and the following ones until `up_to`
        rows are ready. Only while no sequence runs and the codec is idle (capture rewrites decode
        state); otherwise it captures nothing. Returns whether it captured and buckets remain.

        The codec's graphs come first: the runner's ready_slots, which admission follows, then rises
        only for batches whose graphs all exist. A failed capture is logged and ends capturing: the
        batches captured before it keep serving."""
        if not (self.scheduler.drained and not self.codec_runner.pending):
            return False
        while self.runner.pending_batches:
            batch = self.runner.pending_batches[0]
            try:
                seconds = self.codec_runner.prepare(batch) + self.runner.prepare([batch])
            except Exception:
                self.runner.stop_capturing()
                logger.exception("capturing the graphs of batch {} failed; serving at most {} sequences at once",
                                 batch, self.runner.ready_slots)
                return False
            logger.info("graphs of batch {} captured in {:.1f} s ({} of {} sequences can run at once)",
                        batch, seconds, self.runner.ready_slots, self.scheduler.n_slots)
            if self.runner.ready_slots >= up_to:
                break
        return bool(self.runner.pending_batches)

    def voice_codes(self, clip: ReferenceClip) -> torch.Tensor | ClipEncode:
        """On the worker thread: a reference clip's codes from the cache, or its encode (one per clip,
        however many requests ask for it), which `iterate` caches once done.

        At most ENCODES_IN_FLIGHT clips encode at once, the others wait their turn. The encode runs
        in chunks with carried state: the same codes as one whole encode, with the activations of
        one chunk at a time (fp32, like the reference)."""
        key = clip.key
        codes = self.reference_cache.cached_copy(key)
        if codes is not None:
            return codes
        if key not in self._encoding:
            self._encoding[key] = ClipEncode(clip.samples)
            self._start_next_encode()
            encode = self._encoding[key]
            if encode.ready() and encode.error is None:  # encoded at once (CPU, or a clip too long for the graph)
                del self._encoding[key]
                return self.reference_cache.put(key, encode.result()).clone()
        return self._encoding[key]

    def _start_next_encode(self) -> None:
        """Start the oldest waiting encodes while fewer than ENCODES_IN_FLIGHT run."""
        running = sum(encode.started and not encode.ready() for encode in self._encoding.values())
        waiting = [encode for encode in self._encoding.values() if not encode.started]
        for encode in waiting[:max(ENCODES_IN_FLIGHT - running, 0)]:
            encode.start(self.reference_encoder)

    def voice_prompt(self, references: list[ReferenceClip], codes: list[torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, str] | None:
        """The prompt columns every chunk voiced by `references` starts with (voice_prefix) and their
        key, kept by the clips' keys and transcripts: built from `codes` (each clip's) the first time,
        else None when not kept."""
        key = tuple((clip.key, clip.transcript) for clip in references)
        kept = self._voice_prompts.get(key)
        if kept is not None:
            self._voice_prompts.move_to_end(key)
            return kept
        if codes is None:
            return None
        kept = self._voice_prompts[key] = self.build_voice_prompt([clip.transcript for clip in references], codes)
        while len(self._voice_prompts) > VOICE_PROMPTS_KEPT:
            self._voice_prompts.popitem(last=False)
        return kept

    def build_voice_prompt(self, transcripts: list[str], codes: list[torch.Tensor]) -> tuple[torch.Tensor, str]:
        m = self.models
        prefix = voice_prefix(m.tokenizer, list(zip(transcripts, codes, strict=True)), m.model.config.num_codebooks)
        return prefix, hashlib.sha1(prefix.numpy().tobytes()).hexdigest()

    def await_voice(self, run: "RequestRun") -> None:
        """`run` starts once its reference clips are encoded (see `_start_voiced`)."""
        self._awaiting_voice.append(run)

    def _start_voiced(self, idle: bool) -> None:
        """Cache the codes of finished encodes and start the requests whose clips all are.
        idle=True (nothing else to step or decode): sleep a millisecond first when no encode has
        finished, rather than spin, or block the worker's queue on an encode."""
        if idle and self._encoding and not any(encode.ready() for encode in self._encoding.values()):
            time.sleep(ENCODE_POLL_S)
        for key, encode in list(self._encoding.items()):
            try:
                if encode.ready():
                    del self._encoding[key]
                    self.reference_cache.put(key, encode.result())
            except Exception:  # its requests fail as they read it (RequestRun.try_start)
                self._encoding.pop(key, None)
                logger.exception("encoding a reference clip failed")
        waiting = []
        for run in self._awaiting_voice:
            try:
                if not run.try_start():
                    waiting.append(run)
            except Exception as exc:  # a failed encode, or its prompt is too long: that request alone fails
                run.fail(exc)
        self._awaiting_voice = waiting
        # A clip still waiting for its turn whose requests have all gone (cancelled) is not encoded.
        wanted = {id(encode) for run in waiting for encode in run.encodes}
        for key, encode in list(self._encoding.items()):
            if not encode.started and id(encode) not in wanted:
                del self._encoding[key]
        self._start_next_encode()

    def start(self, request: PreparedRequest, job: Job) -> None:
        """On the worker thread: resolve the voice (starting the encodes of new clips) and queue the
        request's first chunk, at once or, when a clip is being encoded, once its codes are there."""
        RequestRun(self, request, job).begin()

    def iterate(self) -> bool:
        """One scheduler iteration; its harvest goes to the codec, finished audio to its requests.
        True while work remains."""
        if self._voices_pending:
            self._start_voiced(idle=not (self.scheduler.busy or self.codec_runner.pending))
        if self.scheduler.needs_capture:
            self.capture_more(up_to=self.scheduler.demand)  # captures once drained for it (see Scheduler)
        harvests = []
        try:
            harvests = self.scheduler.iteration()
            for h in harvests:
                h.owner.harvested(h.codes)
            if harvests:
                self.codec_runner.submit(harvests)
            completed = self.codec_runner.completed(wait=not self.scheduler.busy)
        except Exception as exc:  # a batched step or decode failed: its sequences fail, the worker lives
            logger.exception("decode step failed; failing the requests in it")
            # Harvested sequences have left the scheduler (finished ones for good): fail them here.
            for owner in [*self.codec_runner.discard(), *(h.owner for h in harvests)]:
                owner.fail(exc)
            self.scheduler.fail_all(exc)
            return self.scheduler.busy or self._voices_pending
        for item in completed:
            try:
                item.owner.deliver(item.audio, item.frames, item.final)
            except Exception as exc:  # e.g. the next chunk's prompt is too long: that request alone fails
                item.owner.fail(exc)
        return self.scheduler.busy or self.codec_runner.pending or self._voices_pending

    @property
    def _voices_pending(self) -> bool:
        """Encodes running or requests waiting for them: the worker keeps iterating."""
        return bool(self._encoding or self._awaiting_voice)


class RequestRun:
    """One request's progress through its text chunks; the scheduler's owner of its sequences."""

    def __init__(self, synth: Synthesizer, request: PreparedRequest, job: Job):
        self.synth, self.request, self.job = synth, request, job
        self.index = 0
        self.fader: SeamFader | None = None
        self.prefix: torch.Tensor | None = None  # the voice's prompt columns (voice_prefix)
        self.prefix_key = ""
        self._voice: list[tuple[str, torch.Tensor | ClipEncode]] = []  # (transcript, codes) per reference
        self._first_chunk_codes: list[torch.Tensor] = []

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled

    def fail(self, exc: BaseException) -> None:
        self.job.finish(exc)

    def begin(self) -> None:
        self.job.mark("started")
        kept = self.synth.voice_prompt(self.request.references)
        if kept is not None:
            self.prefix, self.prefix_key = kept
        else:
            self._voice = [(clip.transcript, self.synth.voice_codes(clip)) for clip in self.request.references]
        if not self.try_start():
            self.synth.await_voice(self)

    @property
    def encodes(self) -> list[ClipEncode]:
        """The encodes of this request's clips that were not cached when it began."""
        return [codes for _, codes in self._voice if isinstance(codes, ClipEncode)]

    def try_start(self) -> bool:
        """Queue the first text chunk once every reference clip's codes are there; False while a
        clip is still being encoded."""
        if self.job.finished:
            return True
        if self.cancelled:
            self.job.finish()
            return True
        if not all(encode.ready() for encode in self.encodes):
            return False
        if self.prefix is None:
            self.prefix, self.prefix_key = self.synth.voice_prompt(
                self.request.references, [codes.result() if isinstance(codes, ClipEncode) else codes
                                          for _, codes in self._voice])
        self.job.mark("voice_ready")
        self._queue_chunk(0)
        return True

    def harvested(self, codes: torch.Tensor) -> None:
        """The chunk's next frames (num_codebooks, n), as they leave the scheduler."""
        self.job.mark("first_frames")
        if not self.request.references and self.index == 0 and len(self.request.chunks) > 1:
            self._first_chunk_codes.append(codes.clone())  # the voice of the next chunks (a device copy)

    def deliver(self, samples: np.ndarray, frames: int, final: bool) -> None:
        """Audio for the chunk's next `frames` frames; `final` ends the chunk."""
        if self.job.finished:  # failed or cancelled meanwhile: nobody listens
            return
        self.job.emit(AudioChunk(self.fader.push(samples), frames, self.index))
        if not final:
            return
        self.job.emit(AudioChunk(self.fader.finish(), 0, self.index))
        if self.index + 1 == len(self.request.chunks):
            self.job.finish()
        else:
            self._queue_chunk(self.index + 1)

    def _queue_chunk(self, index: int) -> None:
        if index == 1 and self._first_chunk_codes:
            codes = torch.cat(self._first_chunk_codes, dim=1).cpu()
            if codes.shape[1]:  # a first chunk that ended at once leaves the next ones unvoiced like it
                self.prefix, self.prefix_key = self.synth.build_voice_prompt([self.request.chunks[0]], [codes])
        self.index = index
        last = len(self.request.chunks) - 1
        rate = self.synth.sample_rate
        self.fader = SeamFader(int(SEAM_FADE_SECONDS * rate), fade_in=index > 0, fade_out=index < last)
        prompt = torch.cat([self.prefix, self.request.text_parts[index]], dim=1)
        limit = self.synth.capacity - MIN_GENERATION_ROOM
        if prompt.shape[1] > limit:
            raise InputError(
                f"the prompt (reference audio and transcript plus text) is {prompt.shape[1]} positions long, "
                f"over this model's limit of {limit}; use a shorter reference clip or a smaller chunk_length"
            )
        p = self.request.params
        # From pageable memory without waiting for the worker's queued steps (a blocking copy would).
        spec = SequenceSpec(prompt.to(self.synth.models.placement.device, non_blocking=True), p.temperature, p.top_p,
                            p.repetition_penalty, _chunk_noise_key(self.request.seed, index), p.max_new_tokens,
                            prefix_key=self.prefix_key, prefix_length=self.prefix.shape[1])
        self.synth.scheduler.submit(spec, self, front=index > 0)


def _chunk_noise_key(seed: int, index: int) -> int:
    return (seed ^ (index * 0x9E3779B9)) & 0xFFFFFFFF


class SeamFader:
    """Fades the first and last few milliseconds of a text chunk's audio as it streams past, so
    chunks join without clicks; holds back the last `n` samples until it knows whether they end
    the chunk."""

    def __init__(self, n: int, *, fade_in: bool, fade_out: bool):
        self.n, self.fade_out = n, fade_out
        self._ramp = np.linspace(0.0, 1.0, n, dtype=np.float32)
        self._faded_in = not fade_in
        self._held = np.zeros(0, dtype=np.float32)

    def push(self, audio: np.ndarray) -> np.ndarray:
        audio = np.concatenate([self._held, audio])
        if not self._faded_in and len(audio):
            m = min(self.n, len(audio))
            audio[:m] *= self._ramp[:m]
            self._faded_in = True
        split = max(len(audio) - self.n, 0)
        self._held = audio[split:]
        return audio[:split]

    def finish(self) -> np.ndarray:
        tail, self._held = self._held, np.zeros(0, dtype=np.float32)
        if self.fade_out and len(tail):
            tail = tail * self._ramp[::-1][-len(tail):]
        return tail
