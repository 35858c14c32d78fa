"""Which CUDA graphs exist when: the decode step's, the codec's and the reference encoder's.

`prepare` captures what one running sequence needs before any request; `capture_more` captures the
rest later, one unit at a time, while no sequence runs (capture rewrites decode state): when the
worker is idle, or when the scheduler has drained for a demand the captured graphs cannot serve
(Scheduler.needs_capture). The units are each larger batch bucket and the reference encoder's
graphs, which come first when the worker is idle, after the buckets in a drain, and before the first
batch of new clips that finds no sequence running (EngineCore); clips that come before them encode
eagerly, to the same codes.
"""

from __future__ import annotations

import time

import torch
from loguru import logger

from ..compile_helpers import CompileHelpers
from .codec_runner import CodecRunner
from .reference_encoder import ReferenceEncoder
from .step_runner import StepRunner


def use_high_priority_stream(device: torch.device) -> None:
    """On the worker thread, before its first GPU work, on CUDA: make a stream of the highest
    priority its current one (the current stream is per thread).

    The thread's eager work (the prefill of admitted requests, copies) then outranks the codec
    chunks, which run on a stream of the lowest priority: whenever SMs free up, the block scheduler
    starts its kernels before more blocks of a codec kernel. CUDA graphs keep the priority of the
    stream they were captured on (torch >= 2.10 instantiates them with node priorities), so the step
    runner captures its graphs at the current stream's priority: the decode steps outrank the
    codec's graphs too. Reference encodes run at this priority or the lowest
    (EngineConfig.encode_priority)."""
    if device.type != "cuda":
        return
    stream = torch.cuda.Stream(device, priority=torch.cuda.Stream.priority_range()[1])
    stream.wait_stream(torch.cuda.default_stream(device))  # weights made on other threads' default stream
    torch.cuda.set_stream(stream)
    logger.info("decode steps run on a CUDA stream of priority {} (the codec's: {})",
                stream.priority, torch.cuda.Stream.priority_range()[0])


class GraphCapture:
    def __init__(self, steps: StepRunner, codec: CodecRunner, encoder: ReferenceEncoder):
        self.steps, self.codec, self.encoder = steps, codec, encoder
        self._encoder_failed = False

    def prepare(self, helpers: CompileHelpers | None = None) -> float:
        """On the worker thread, before any request: compile, and capture the graphs of one running
        sequence (decode step, codec) and the codec's of two. With compile helpers (a first start:
        compile_helpers), the engine captures the step's graphs of two rows too while they compile
        the prefill's and the codec's regions (the reference encoder's with the codec's), then waits
        for each before its graphs. Returns the seconds it took."""
        started = time.perf_counter()
        helpers = helpers or CompileHelpers()
        try:
            self.steps.prepare([1], prefill=not helpers.running())
            if helpers.running() and 2 in self.steps.pending_batches:
                self._capture_step_of(2)
            helpers.wait("prefill")
            self.steps.prepare_prefill()
            if self.steps.policy.cuda_graphs:
                helpers.wait("codec")
                self._prepare_codec()
        finally:
            helpers.close()  # those not waited for, where a capture failed
        return time.perf_counter() - started

    def prepare_part(self, part: str) -> float:
        """One compile helper's part (compile_helpers.PARTS), in its process or in the engine's."""
        started = time.perf_counter()
        if part == "codec":
            self._prepare_codec()
            self.encoder.prepare()
        elif part == "prefill":
            self.steps.compile_prefill(batched=self.steps.cache.n_slots > 1)
        else:
            raise ValueError(f"unknown part {part!r}")
        return time.perf_counter() - started

    def _prepare_codec(self) -> None:
        # The codec's graphs of two rows too: their capture compiles the post-transformer's graph
        # for every row count above one (set_up_codec), which would otherwise happen at the first
        # larger batch's capture, while requests wait.
        self.codec.prepare(min(2, self.codec.rows))

    @property
    def encoder_pending(self) -> bool:
        """The reference encoder's graphs are still to be captured (never without CUDA graphs, nor
        after a failed capture)."""
        return self.steps.policy.cuda_graphs and not self.encoder.captured and not self._encoder_failed

    @property
    def pending(self) -> bool:
        """Graphs remain for capture_more."""
        return self.encoder_pending or bool(self.steps.pending_batches)

    def capture_encoder(self) -> None:
        """The reference encoder's graphs, now; the caller makes sure no encode runs. A failure is
        logged and ends the encoder's capturing: new clips then encode eagerly (the same codes)."""
        try:
            seconds = self.encoder.prepare()
        except Exception:
            self._encoder_failed = True
            logger.exception("capturing the reference encoder's graphs failed; new clips encode eagerly")
            return
        logger.info("reference encoder's graphs captured in {:.1f} s", seconds)

    def _capture_step_of(self, batch: int) -> None:
        """The step's graphs of `batch` rows ahead of their turn in capture_more (the codec's
        follow there); a failure stops capturing, as there."""
        try:
            self.steps.prepare([batch], prefill=False)
        except Exception:
            logger.exception("capturing the graphs of batch {} failed; serving at most {} sequences at once",
                             batch, self.steps.ready_slots)

    def capture_more(self, up_to: int = 0, encodes_idle: bool = True) -> bool:
        """Capture what is still missing; the caller makes sure no sequence runs and the codec is
        idle, and tells whether an encode runs (`encodes_idle`: an encode and the encoder's capture
        would share its streaming state). Idle (`up_to` rows already ready): one unit, the encoder's
        graphs first, else the next batch bucket's codec and step graphs. For a demand: the batch
        buckets until `up_to` rows are ready, then the encoder's graphs while nothing runs anyway
        (under load from the start the worker may not idle for a while). Returns whether graphs
        remain.

        A bucket's codec graphs come first: the runner's ready_slots, which admission follows, then
        rises only for batches whose graphs all exist. A failed capture is logged and ends capturing
        (of the batches, or of the encoder): what was captured before it keeps serving."""
        demand = up_to > self.steps.ready_slots
        if self.encoder_pending and encodes_idle and not demand:
            self.capture_encoder()
            return self.pending
        while self.steps.pending_batches:
            batch = self.steps.pending_batches[0]
            try:
                seconds = self.codec.prepare(batch) + self.steps.prepare([batch])
            except Exception:
                self.steps.stop_capturing()
                logger.exception("capturing the graphs of batch {} failed; serving at most {} sequences at once",
                                 batch, self.steps.ready_slots)
                break
            logger.info("graphs of batch {} captured in {:.1f} s ({} of {} sequences can run at once)",
                        batch, seconds, self.steps.ready_slots, self.steps.cache.n_slots)
            if self.steps.ready_slots >= up_to:
                break
        if demand and self.encoder_pending and encodes_idle:
            self.capture_encoder()
        return self.pending
