"""The engine on its GPU worker thread: EngineCore assembles the runtime (KV cache, step runner,
scheduler, codec, reference encoder), starts requests, and runs the engine step; a RequestRun is
one request's progress through it.

One `step()`: start the requests whose voices are ready, capture larger batch graphs when the
demand needs them, then schedule → run the batch on the GPU → read the frame counts back (the
DecodeLoop), decode the frames handed out to audio (the CodecRunner, beside the next steps), and
deliver the finished audio to its requests, which queue their next text chunk when one ends.

A request is its voice, then its text chunks one after another. Every chunk is prompted with the
same voice: the given references, or, without any, the first chunk's own output as the reference
for the rest (so that an unprompted voice stays the same across chunks). Each chunk is one sequence
for the scheduler; the engine submits the sequence a run has queued (`next_sequence`), and hands
the run its frames and audio back. Chunks are joined with short fades (SeamFader).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from loguru import logger

from .clip_encodes import ClipEncode, ClipEncodeQueue, CodesWaiter
from .compilation import CompilePolicy
from .compile_helpers import CompileHelpers
from .config import EngineConfig
from .device import copy_may_overlap
from .errors import InputError
from .loader import LoadedModels
from .references import ReferenceCodeCache
from .request import AudioChunk, PreparedRequest, ReferenceClip
from .runtime.codec_runner import CodecRunner, set_up_codec
from .runtime.decode_loop import DecodeLoop
from .runtime.graph_capture import GraphCapture, use_high_priority_stream
from .runtime.kv_cache import KVCache
from .runtime.prefix_cache import PrefixCache
from .runtime.reference_encoder import ReferenceEncoder
from .runtime.scheduler import SequenceSpec
from .runtime.step_runner import StepRunner
from .runtime.worker import Job
from .seam_fader import SEAM_FADE_SECONDS, SeamFader
from .voice_prompts import VoicePromptCache

# Prompts must leave this much context for generation (the reference demands 2048 of its 8192).
MIN_GENERATION_ROOM = 1024
PREFIX_CACHE_BYTES = 2 * 1024**3  # prefilled voice prefixes kept on the device (~18k positions at full size)
# Reference audio encodes ~1.5 s at a time: the activations of one chunk at a time bound the peak
# memory, at a few milliseconds more per clip than larger chunks.
REFERENCE_CHUNK_FRAMES = 32
# Clips up to this long encode through the chunk graph, whose RoPE tables are sized for them up front
# (~95 s; a raised max_reference_seconds makes longer clips encode eagerly instead of growing the tables).
GRAPHED_REFERENCE_FRAMES = 2048


class EngineCore:
    def __init__(self, config: EngineConfig, models: LoadedModels, reference_cache: ReferenceCodeCache,
                 policy: CompilePolicy, *, slots: int, capacity: int):
        """slots: sequences decoded at once; capacity: KV positions per sequence."""
        self.config, self.models = config, models
        self.capacity = capacity
        c = models.model.config
        cache = KVCache(c.n_layer, slots, c.n_local_heads, capacity, c.head_dim, models.placement.dtype,
                        models.placement.device)
        self.runner = StepRunner(models.model, cache, policy, exact_vocab=config.exact_sampling)
        if not config.exact_sampling:
            # The runner's head copied the 4,097 rows it samples codebook 0 from; nothing else reads
            # the other 151,679 rows of the output matrix (310 MB in bf16 at full size): free them.
            models.model.release_output_()
        self.prefix_cache = PrefixCache(cache, PREFIX_CACHE_BYTES)
        self.decode_loop = DecodeLoop.over(self.runner, self.prefix_cache, config.scheduler_config(),
                                           frame_rate=models.codec.config.frame_rate)
        self.scheduler = self.decode_loop.scheduler
        set_up_codec(models.codec, policy)
        self.codec_runner = CodecRunner(models.codec, slots, capacity)
        reference_frames = math.ceil(config.max_reference_seconds * models.codec.config.frame_rate)
        # encode_priority: encodes at the decode steps' priority, the highest where decode_priority sets it.
        self.reference_encoder = ReferenceEncoder(models.codec, REFERENCE_CHUNK_FRAMES,
                                                  min(reference_frames, GRAPHED_REFERENCE_FRAMES),
                                                  max_batch=min(config.max_encode_batch, slots),
                                                  high_priority=config.encode_priority and config.decode_priority,
                                                  lone_chunk_frames=config.lone_clip_chunk_frames)
        self.graphs = GraphCapture(self.runner, self.codec_runner, self.reference_encoder)
        self.clip_encodes = ClipEncodeQueue(self.reference_encoder, reference_cache,
                                            before_batch=self._capture_encoder_if_nothing_runs)
        self.voice_prompts = VoicePromptCache(models.tokenizer, c.num_codebooks)

    @property
    def sample_rate(self) -> int:
        return self.models.codec.config.sample_rate

    def set_stream_priority(self) -> None:
        """On the worker thread, first: its GPU work outranks the codec's (EngineConfig.decode_priority)."""
        if self.config.decode_priority:
            use_high_priority_stream(self.models.placement.device)

    def prepare(self, helpers: CompileHelpers | None = None) -> float:
        """On the worker thread, before any request: see GraphCapture.prepare."""
        return self.graphs.prepare(helpers)

    def capture_more(self, up_to: int = 0) -> bool:
        """Capture the graphs not captured yet (see GraphCapture.capture_more), only while no
        sequence runs and the codec is idle; otherwise it captures nothing. Returns whether it
        captured and graphs remain."""
        if not self._nothing_runs:
            return False
        return self.graphs.capture_more(up_to, encodes_idle=not self.clip_encodes.busy)

    @property
    def _nothing_runs(self) -> bool:
        """No sequence runs or waits for its read-back and the codec is idle: graphs may be captured."""
        return self.scheduler.drained and not self.codec_runner.pending

    def _capture_encoder_if_nothing_runs(self) -> None:
        """Before a batch of new clips, while no encode runs: the encoder's graphs, when they are
        still missing and no sequence runs (a client whose requests come one after another leaves the
        worker no idle time for them). With sequences running the clips encode eagerly: the capture
        would hold up their steps."""
        if self.graphs.encoder_pending and self._nothing_runs:
            self.graphs.capture_encoder()

    def start(self, request: PreparedRequest, job: Job) -> None:
        """On the worker thread: resolve the voice (starting the encodes of new clips) and queue the
        request's first chunk, at once or, when a clip is being encoded, once its codes are there."""
        run = RequestRun(request, job, prompts=self.voice_prompts, encodes=self.clip_encodes,
                         sample_rate=self.sample_rate, capacity=self.capacity, device=self.models.placement.device)
        if run.begin():
            self._submit(run)
        else:
            self.clip_encodes.await_voice(run)

    def encode(self, clip: ReferenceClip, job: Job) -> None:
        """On the worker thread: emit a clip's codes to `job` and finish it, at once when cached, else
        once a later step finds its encode done (one encode with any request bringing the same clip);
        the running sequences decode meanwhile."""
        waiter = CodesWaiter(self.clip_encodes.codes(clip), job)
        if not waiter.try_start():
            self.clip_encodes.await_voice(waiter)

    def step(self) -> bool:
        """One engine step; True while work remains."""
        if self.clip_encodes.busy:
            for run in self.clip_encodes.poll(idle=not (self.scheduler.busy or self.codec_runner.pending)):
                if isinstance(run, RequestRun):  # a CodesWaiter is done once started
                    self._submit(run)
        if self.scheduler.needs_capture:
            self.capture_more(up_to=self.scheduler.demand)  # captures once drained for it (see Scheduler)
        harvests = []
        try:
            harvests = self.decode_loop.step()
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
            self.decode_loop.fail_all(exc)
            return self.scheduler.busy or self.clip_encodes.busy
        for item in completed:
            try:
                item.owner.deliver(item.audio, item.frames, item.final)
                self._submit(item.owner)
            except Exception as exc:  # e.g. the next chunk's prompt is too long: that request alone fails
                item.owner.fail(exc)
        return self.scheduler.busy or self.codec_runner.pending or self.clip_encodes.busy

    def _submit(self, run: RequestRun) -> None:
        spec = run.next_sequence()
        if spec is not None:
            self.decode_loop.submit(spec, run, front=run.continues)


class RequestRun:
    """The owner of a request's sequences: cancelled with its job, failed through it."""

    def __init__(self, request: PreparedRequest, job: Job, *, prompts: VoicePromptCache, encodes: ClipEncodeQueue,
                 sample_rate: int, capacity: int, device: torch.device):
        """capacity: KV positions per sequence; device: where prompts go."""
        self.request, self.job = request, job
        self.prompts, self.encodes_queue = prompts, encodes
        self.sample_rate, self.capacity, self.device = sample_rate, capacity, device
        self.index = 0
        self.fader: SeamFader | None = None
        self.prefix: torch.Tensor | None = None  # the voice's prompt columns (voice_prefix)
        self.prefix_key = ""
        self._voice: list[tuple[str, torch.Tensor | ClipEncode]] = []  # (transcript, codes) per reference
        self._first_chunk_codes: list[torch.Tensor] = []
        self._queued: SequenceSpec | None = None

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled

    def fail(self, exc: BaseException) -> None:
        self.job.finish(exc)

    def next_sequence(self) -> SequenceSpec | None:
        """The sequence of the chunk this run has queued, for the engine to submit (once)."""
        spec, self._queued = self._queued, None
        return spec

    @property
    def continues(self) -> bool:
        """The queued chunk is a later one: its listener is waiting (see Scheduler.submit's front)."""
        return self.index > 0

    def begin(self) -> bool:
        """Resolve the voice (starting the encodes of new clips) and queue the first chunk; False while
        a clip is being encoded (then `try_start` once it is)."""
        self.job.mark("started")
        kept = self.prompts.get(self.request.references)
        if kept is not None:
            self.prefix, self.prefix_key = kept
        else:
            self._voice = [(clip.transcript, self.encodes_queue.codes(clip)) for clip in self.request.references]
        return self.try_start()

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
            self.prefix, self.prefix_key = self.prompts.get(
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
        """Audio for the chunk's next `frames` frames; `final` ends the chunk (and queues the next)."""
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
                self.prefix, self.prefix_key = self.prompts.build([self.request.chunks[0]], [codes])
        self.index = index
        last = len(self.request.chunks) - 1
        self.fader = SeamFader(int(SEAM_FADE_SECONDS * self.sample_rate), fade_in=index > 0, fade_out=index < last)
        prompt = torch.cat([self.prefix, self.request.text_parts[index]], dim=1)
        limit = self.capacity - MIN_GENERATION_ROOM
        if prompt.shape[1] > limit:
            raise InputError(
                f"the prompt (reference audio and transcript plus text) is {prompt.shape[1]} positions long, "
                f"over this model's limit of {limit}; use a shorter reference clip or a smaller chunk_length"
            )
        p = self.request.params
        # From pageable memory without waiting for the worker's queued steps (a blocking copy would).
        prompt = prompt.to(self.device, non_blocking=copy_may_overlap(self.device))
        self._queued = SequenceSpec(prompt, p.temperature, p.top_p, p.repetition_penalty,
                                    chunk_noise_key(self.request.seed, index), p.max_new_tokens,
                                    prefix_key=self.prefix_key, prefix_length=self.prefix.shape[1])


def chunk_noise_key(seed: int, index: int) -> int:
    return (seed ^ (index * 0x9E3779B9)) & 0xFFFFFFFF
