"""Harvested frames -> audio, for every running sequence at once, beside the decode steps.

One streaming codec decoder holds a stream (row) per KV slot. The frames harvested in one
engine step decode together: one batched call per chunk length (the scheduler hands most
sequences out on the same step with the same length, so there are few calls). A sequence's first
frames reset its row, starting a new utterance there.

On CUDA the codec runs on its own CUDA stream, so its convolutions overlap the next decode steps
instead of stalling them, and its audio is copied to pinned host memory; `completed()` hands out
the audio whose copy has landed, oldest first, without waiting. Elsewhere it runs at once.

While it captures, the decoder's convolutions are timed for each shape (engine/model/tuned_conv.py).

With CUDA graphs, the chunk lengths (BLOCK_SIZES, and a stream's shorter last chunk padded to one
of them) replay a graph captured per (row bucket, length) instead of launching the decoder's
~1,500 kernels from Python, which would keep the host (and so the decode steps) waiting. A graph
decodes a bucket of rows: the rows a call does not use point at one spare stream, whose state
nobody reads, and cost as much GPU time as real ones. The buckets are the powers of two and the
sizes halfway between them (ROW_BUCKET_STEPS), so that at most a third of the rows a graph decodes
are padding (half, with powers of two alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from loguru import logger

from ..model.codec import ModdedDAC
from ..model.codec_stream import StreamingDecoder
from ..model.codec_streamers import PointwiseOps, compiled_layer_forward, compiled_pointwise
from ..model.codec_transformer import WindowLimitedTransformer
from ..model.compile_ahead import compiling_ahead
from ..model.stream_state import Rows
from ..model.tuned_conv import tune_convs, tuning
from .cuda_graphs import capture
from .decode_loop import Harvest
from .scheduler import BLOCK, BLOCK_SIZES
from .step_runner import bucket_for


def set_up_codec(codec: ModdedDAC, policy) -> None:
    """Make the codec's streamed paths the ones the engine's graphs replay; call it before building
    the streaming decoders and encoders. When the policy compiles (CUDA with Triton): the decoder
    streamed on channels-last activations by Triton kernels; the encoder's residual units fused, each
    pointwise pass one compiled kernel (eagerly, a Snake is five passes over the largest tensors); and
    the layers of every transformer on the streamed paths (the quantizer's post-transformer when
    decoding; the encoder's and the quantizer's pre-transformer when encoding reference clips)
    compiled by Inductor (eager, one layer is ~65 small kernels, most of a small call's GPU time),
    unless their weights are quantized (every --quantize mode but none gives the codec's
    transformers int8 weights). Otherwise, with CUDA graphs, the decoder's convolutions tuned per
    shape (timed while a CodecRunner captures)."""
    if policy.compile:
        from ..model import conv_kernel

        codec.decoder.use_channels_last(conv_kernel.TRITON_OPS)
        codec.encoder.stream_pointwise_with(_compiled_pointwise(policy))
        for transformer in streamed_transformers(codec):
            if all(type(p) is torch.nn.Parameter for p in transformer.parameters()):  # not torchao's tensors
                transformer.stream_layers_with(_compiled_layers(policy))
    elif policy.cuda_graphs:
        tune_convs(codec.decoder)


def streamed_transformers(codec: ModdedDAC) -> list[WindowLimitedTransformer]:
    """The transformers of the decode path (post_module) and of the encode path (the encoder's, and
    the quantizer's pre_module)."""
    q = codec.quantizer
    encoder = [m for m in codec.encoder.modules() if isinstance(m, WindowLimitedTransformer)]
    return [q.post_module, *encoder, q.pre_module]


def _codec_backend(policy):
    """Inductor for the codec's regions, without programmatic dependent launch: it shortens chains
    of small kernels (a batch-1 decode step), not the codec's calls, and a kernel that may launch
    with it needs Triton's launcher, a C module built by the C compiler at the first start, where
    Inductor's own launcher needs none."""
    return dataclasses.replace(policy, pdl=False).inductor_backend()


@functools.cache
def _compiled_pointwise(policy) -> PointwiseOps:
    """The encoder's compiled pointwise passes, one set per policy and process (see compiled_pointwise)."""
    return compiled_pointwise(_codec_backend(policy))


@functools.cache
def _compiled_layers(policy) -> Callable:
    """One compiled layer_forward per policy and process: the graphs of every wrapper count against
    one recompile limit (see compiled_layer_forward), and engines built one after another (tests,
    reloads) share these, each codec's weights being inputs of the graphs."""
    return compiled_layer_forward(_codec_backend(policy))


# Row buckets: these sizes times the powers of two (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, ...).
ROW_BUCKET_STEPS = (2, 3)


def codec_row_buckets(rows: int) -> list[int]:
    """The codec graphs' row buckets for `rows` streams: 1, then each power of two and 1.5 times
    it below `rows`, then `rows`."""
    sizes, power = {1}, 1
    while power < rows:
        sizes.update(step * power // 2 for step in ROW_BUCKET_STEPS)
        power *= 2
    return sorted(size for size in sizes if size < rows) + [rows]


@dataclass
class Decoded:
    owner: Any
    audio: np.ndarray  # float32 mono
    frames: int
    final: bool


@dataclass
class _Pending:
    harvests: list[Harvest]
    outputs: list[tuple[list[int], torch.Tensor]]  # (harvest indices, host audio (b, n * frame_length))
    ready: Any  # CUDA event after the copies, or None


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    codes: torch.Tensor  # (bucket, num_codebooks, n) input
    index: torch.Tensor  # (bucket,) rows
    audio: torch.Tensor  # (bucket, n * frame_length) output


class CodecRunner:
    def __init__(self, codec: ModdedDAC, rows: int, max_frames: int):
        self.rows = rows
        self.decoder = StreamingDecoder(codec, batch=rows + 1)  # row `rows` is the spare one
        self.decoder.reserve(max_frames + BLOCK)
        self.num_codebooks = codec.config.num_codebooks
        device = next(codec.parameters()).device
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._pending: deque[_Pending] = deque()
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = None  # every codec graph shares one memory pool
        self.row_buckets = codec_row_buckets(rows)
        # Every graph resets the spare row through this; kept here, since a graph holds no reference
        # to the tensors it reads (one freed and reused would turn the reset's index into garbage).
        self._spare = Rows(torch.full((1,), rows, dtype=torch.long, device=device), np.full(1, rows))

    def prepare(self, up_to: int | None = None) -> float:
        """Capture a graph per chunk length for each row bucket of at most `up_to` rows (all by
        default) not captured yet; CUDA only, and only while nothing is pending. Returns the
        seconds it took."""
        started = time.perf_counter()
        captured = len(self._graphs)
        todo = [(bucket, n) for bucket in self.row_buckets if up_to is None or bucket <= up_to
                for n in BLOCK_SIZES if (bucket, n) not in self._graphs]
        with torch.inference_mode(), tuning(self.decoder.codec.decoder):
            self._compile_ahead(todo)
            for bucket, n in todo:
                self._capture(bucket, n)
        self.decoder.reset()
        if self.stream is not None:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        logger.info("captured {} codec CUDA graphs in {:.1f} s", len(self._graphs) - captured, seconds)
        return seconds

    def _compile_ahead(self, graphs: list[tuple[int, int]]) -> None:
        """Compile the channels-last decoder's Triton kernels of these (row bucket, length) graphs at
        once (compile_ahead), by one call of each graph's decode whose kernels only compile; the
        spare row's state they leave behind is reset by every replay and at the end of prepare()."""
        if self.decoder.codec.decoder.channels_last is None or self.stream is None:
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with compiling_ahead() as ahead, torch.cuda.stream(self.stream):
            for bucket, n in graphs if ahead else []:
                *_, decode = self._spare_decode(bucket, n)
                decode()

    def _spare_decode(self, bucket: int, n: int) -> tuple[torch.Tensor, torch.Tensor, Callable[[], torch.Tensor]]:
        """The inputs (codes, rows' index) of a decode of n frames for `bucket` rows, all the spare
        row, and that decode."""
        codes = torch.zeros(bucket, self.num_codebooks, n, dtype=torch.long, device=self.device)
        index = torch.full((bucket,), self.rows, dtype=torch.long, device=self.device)
        rows = Rows(index, np.full(bucket, self.rows))

        def decode() -> torch.Tensor:
            self.decoder.reset_rows(self._spare)
            return self.decoder.decode_rows(codes, rows)[:, 0]

        return codes, index, decode

    def _capture(self, bucket: int, n: int) -> None:
        """Capture the graph decoding n frames for `bucket` rows (all the spare row while capturing).

        Each replay first resets the spare row: every padded replay advances it, and it never ends
        an utterance, so its transformer position would otherwise grow past the RoPE table (an
        out-of-bounds gather on the device, fatal to the process, once padded replays add up to the
        table's length: the KV capacity plus a chunk, ~8,200 frames by default). The reset is 39
        small fills at full size (the row's 2.2 M state elements); its position alone would do, should
        those ever show in a profile."""
        codes, index, decode = self._spare_decode(bucket, n)
        graph, audio = capture(decode, self.stream, self._pool)
        self._pool = graph.pool()
        self._graphs[(bucket, n)] = _Graph(graph, codes, index, audio)

    def _decode(self, codes: torch.Tensor, rows: list[int], last: bool = False) -> torch.Tensor:
        """(b, n * frame_length) audio for codes (b, num_codebooks, n) on the current stream.

        last: the streams end with these frames. A short last chunk is padded to a graphed length:
        the codec is causal, so the padding changes only audio after the real frames, which is cut,
        and state that the next stream in the row resets."""
        n, bucket = codes.shape[-1], bucket_for(len(rows), self.row_buckets)
        padded = next((m for m in BLOCK_SIZES if m >= n), n) if last and self._graphs else n
        entry = self._graphs.get((bucket, padded))
        if entry is None:
            return self.decoder.decode(codes, rows=rows)[:, 0]
        b = len(rows)
        entry.codes[:b, :, n:].zero_()  # a fill on the device: `= 0` would wait for the codec's stream
        entry.codes[:b, :, :n].copy_(codes)
        index = torch.full((entry.index.shape[0],), self.rows, dtype=torch.long, pin_memory=self.stream is not None)
        index[:b] = torch.tensor(rows)
        entry.index.copy_(index, non_blocking=True)
        entry.graph.replay()
        return entry.audio[:b, : n * (entry.audio.shape[1] // padded)]

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    @torch.inference_mode()
    def submit(self, harvests: list[Harvest]) -> None:
        """Start decoding the harvests' frames (their codes are copied now: the slots move on)."""
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, h in enumerate(harvests):
            if h.codes.shape[1]:
                by_length[h.codes.shape[1]].append(i)
        groups = [(indices, torch.stack([harvests[i].codes for i in indices])) for indices in by_length.values()]
        starting = [h.slot for h in harvests if h.first]
        outputs = []
        side = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
        with side:
            if starting:
                self.decoder.reset(starting)
            for indices, codes in groups:
                last = all(harvests[i].final for i in indices)
                audio = self._decode(codes, [harvests[i].slot for i in indices], last)
                if self.stream is not None:
                    codes.record_stream(self.stream)  # made on the main stream, read here
                    host = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
                    host.copy_(audio, non_blocking=True)
                else:
                    host = audio.cpu()
                outputs.append((indices, host))
            ready = None
            if self.stream is not None:
                ready = torch.cuda.Event()
                ready.record(self.stream)
        self._pending.append(_Pending(harvests, outputs, ready))

    def completed(self, wait: bool = False) -> list[Decoded]:
        """Audio of submitted harvests whose decode has finished, in submission order; wait=True
        blocks for the oldest one if none has finished."""
        done, finished = [], 0
        for item in self._pending:
            if item.ready is not None and not item.ready.query():
                if not (wait and not done):
                    break
                item.ready.synchronize()
            audio = [np.zeros(0, dtype=np.float32)] * len(item.harvests)
            for indices, host in item.outputs:
                rows = host.numpy()
                for row, i in enumerate(indices):
                    audio[i] = rows[row].copy()  # not a view of the reused pinned buffer
            done.extend(Decoded(h.owner, a, h.codes.shape[1], h.final) for h, a in zip(item.harvests, audio))
            finished += 1
        # Taken off only now: if anything above raised, every item is still pending, and `discard`
        # names all their owners for the caller to fail.
        for _ in range(finished):
            self._pending.popleft()
        return done

    def discard(self) -> list[Any]:
        """Forget undelivered work (after a failure); returns its owners."""
        owners = [h.owner for item in self._pending for h in item.harvests]
        self._pending.clear()
        return owners
