"""EngineCore: the engine on its GPU worker thread. It assembles the runtime (KV cache, step
runner, scheduler, codec, reference encoder), starts requests, and runs the engine step.

One `step()`: start the requests whose voices are ready, capture larger batch graphs when the
demand needs them, then schedule → run the batch on the GPU → read the frame counts back (the
DecodeLoop), decode the frames handed out to audio (the CodecRunner, beside the next steps), and
deliver the finished audio to its requests, which queue their next text chunk when one ends.
"""

from __future__ import annotations

import math

from loguru import logger

from .clip_encodes import ClipEncodeQueue
from .compilation import CompilePolicy
from .config import EngineConfig
from .loader import LoadedModels
from .references import ReferenceCodeCache
from .request import PreparedRequest
from .request_run import RequestRun
from .runtime.codec_runner import CodecRunner, set_up_codec
from .runtime.decode_loop import DecodeLoop
from .runtime.graph_capture import GraphCapture, use_high_priority_stream
from .runtime.kv_cache import KVCache
from .runtime.prefix_cache import PrefixCache
from .runtime.reference_encoder import ReferenceEncoder
from .runtime.step_runner import StepRunner
from .runtime.worker import Job
from .voice_prompts import VoicePromptCache

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
        self.reference_encoder = ReferenceEncoder(models.codec, REFERENCE_CHUNK_FRAMES,
                                                  min(reference_frames, GRAPHED_REFERENCE_FRAMES),
                                                  max_batch=min(config.max_encode_batch, slots))
        self.graphs = GraphCapture(self.runner, self.codec_runner, self.reference_encoder)
        self.clip_encodes = ClipEncodeQueue(self.reference_encoder, reference_cache)
        self.voice_prompts = VoicePromptCache(models.tokenizer, c.num_codebooks)

    @property
    def sample_rate(self) -> int:
        return self.models.codec.config.sample_rate

    def set_stream_priority(self) -> None:
        """On the worker thread, first: its GPU work outranks the codec's (EngineConfig.decode_priority)."""
        if self.config.decode_priority:
            use_high_priority_stream(self.models.placement.device)

    def prepare(self) -> float:
        """On the worker thread, before any request: see GraphCapture.prepare."""
        return self.graphs.prepare()

    def capture_more(self, up_to: int = 0) -> bool:
        """Capture larger batches' graphs (see GraphCapture.capture_more), only while no sequence
        runs and the codec is idle; otherwise it captures nothing. Returns whether it captured and
        buckets remain."""
        if not (self.scheduler.drained and not self.codec_runner.pending):
            return False
        return self.graphs.capture_more(up_to)

    def start(self, request: PreparedRequest, job: Job) -> None:
        """On the worker thread: resolve the voice (starting the encodes of new clips) and queue the
        request's first chunk, at once or, when a clip is being encoded, once its codes are there."""
        run = RequestRun(request, job, prompts=self.voice_prompts, encodes=self.clip_encodes,
                         sample_rate=self.sample_rate, capacity=self.capacity, device=self.models.placement.device)
        if run.begin():
            self._submit(run)
        else:
            self.clip_encodes.await_voice(run)

    def step(self) -> bool:
        """One engine step; True while work remains."""
        if self.clip_encodes.busy:
            for run in self.clip_encodes.poll(idle=not (self.scheduler.busy or self.codec_runner.pending)):
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
