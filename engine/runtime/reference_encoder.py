"""Reference clips -> codes, several clips in one pass, a fixed number of frames at a time; on CUDA
each chunk of a batch is one graph replay.

Clips that arrive together can encode as the rows of one batch: batch 1 leaves most of the GPU
idle, and a pass of 8 clips takes about four times as long as one clip alone, so a burst of new
voices takes about half the GPU time it takes one clip after another. The rows of a batch are padded to its
longest clip, whose chunks all rows step through; the caller groups clips of similar length
(clip_encodes.length_bucket), so little of that is padding. Batch sizes are buckets (1, 2, 4, 8, ...)
with a graph each; empty rows of a bucket encode silence, which nobody reads (three waiting clips
cost less as one pass of four than as passes of two and one, see clip_encodes).

Encoding a clip eagerly launches ~1,300 kernels per 32-frame chunk from Python, several times the
clip's GPU time, and more inside a busy server, where the worker thread that encodes also runs every
decode step. The chunk's graph replays the same kernels with one launch: the same codes. Every chunk
of a pass, the last one included, has the same size: the last is padded with zeros, which the causal
encoder sees only after the clip's real frames, whose codes are kept. A pass of one clip may take
longer chunks than batched passes (`lone_chunk_frames`): its kernels are small, so their number more
than their work sets its GPU time.

On CUDA the encodes run on a stream of their own (`start`): the worker thread goes on stepping the
running sequences, whose steps the encode's kernels share the GPU with, instead of waiting for each
batch of new voices. The engine runs one batch at a time (clip_encodes): a burst of batches queued at
once would fill the GPU's command buffer and hold up every launch behind them.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..model.codec import ModdedDAC
from ..model.codec_stream import StreamingEncoder, encode_chunked
from .cuda_graphs import capture


class EncodeHandle:
    """The codes of one clip, once its encode (possibly still running on the GPU) has finished."""

    def __init__(self, codes: torch.Tensor, done: torch.cuda.Event | None = None, keep: tuple = ()):
        """codes: (num_codebooks, frames); with `done`, a view of a pinned buffer that the GPU fills
        until the event; `keep`: what must live until then (the input's pinned copy)."""
        self._codes, self._done, self._keep = codes, done, keep

    def ready(self) -> bool:
        return self._done is None or self._done.query()

    def result(self) -> torch.Tensor:
        """(num_codebooks, frames) int64 codes on the CPU; waits for the encode if it is running."""
        if self._done is not None:
            self._done.synchronize()
            self._codes = self._codes.clone()  # out of the pinned buffer
            self._done, self._keep = None, ()
        return self._codes


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to max_batch (itself the last bucket)."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes + [max_batch] if max_batch > 1 else sizes


class ReferenceEncoder:
    """A streaming encoder per batch bucket and, after prepare(), their chunk graphs. Stateful: call
    it from one thread at a time (the engine's GPU worker)."""

    def __init__(self, codec: ModdedDAC, chunk_frames: int, max_frames: int, max_batch: int = 1,
                 high_priority: bool = False, lone_chunk_frames: int | None = None):
        """chunk_frames: frames encoded at a time (bounds the activations held at once);
        lone_chunk_frames: the same for a pass of one clip (default chunk_frames), whose GPU time goes
        more to its kernels' number than to their work, so that fewer, longer chunks cost it less;
        max_frames: the longest clip, in frames, that the batched encoders (and their graphs) take;
        max_batch: the most clips encoded in one pass; high_priority: on CUDA, encode on a stream of
        the highest priority (the decode steps'), not the lowest (the codec's)."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.codec, self.chunk_frames, self.max_frames = codec, chunk_frames, max_frames
        self.device = next(codec.parameters()).device
        self.batches = batch_buckets(max_batch)
        self._chunk_frames = {b: chunk_frames for b in self.batches} | {1: lone_chunk_frames or chunk_frames}
        self._encoders = {b: StreamingEncoder(codec, batch=b) for b in self.batches}
        for batch, encoder in self._encoders.items():
            # Replays run whole chunks, so the longest clip reaches its last chunk's padded end.
            frames = self._chunk_frames[batch]
            encoder.reserve(-(-max_frames // frames) * frames)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}  # batch -> graph, in, out
        self._stream = None
        if self.device.type == "cuda":
            lowest, highest = torch.cuda.Stream.priority_range()
            self._stream = torch.cuda.Stream(self.device, priority=highest if high_priority else lowest)

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    @property
    def captured(self) -> bool:
        """Every batch bucket's chunk graph exists (prepare() ran); until then encodes run eagerly."""
        return len(self._graphs) == len(self.batches)

    def chunk_samples(self, batch: int) -> int:
        """The samples a pass of `batch` clips (a batch bucket) encodes at a time."""
        return self._chunk_frames[batch] * self.codec.config.frame_length

    def frames_of(self, samples: int) -> int:
        return -(-samples // self.codec.config.frame_length)

    def prepare(self) -> float:
        """Capture every batch bucket's chunk graph (CUDA only) on the encoder's own stream, the one
        it replays on. A graph keeps the cuBLAS workspace of the stream it was captured on (see
        cuda_graphs.capture), and torch hands out streams from a small pool in turn, so a stream
        taken for the capture alone could later be another runner's, whose matmuls would share that
        workspace during a replay. The graphs share one memory pool: they replay one after another
        on that one stream, never at once. Returns the seconds it took."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device; the codec is on {self.device}: encode eagerly")
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for batch, encoder in self._encoders.items():
                chunk = torch.zeros(batch, 1, self.chunk_samples(batch), device=self.device)
                graph, codes = capture(lambda: encoder.step(chunk), self._stream, pool)  # noqa: B023 (called here)
                self._graphs[batch] = graph, chunk, codes
                encoder.reset()
        return time.perf_counter() - started

    def encode(self, samples: np.ndarray) -> torch.Tensor:
        """44.1 kHz mono float32 samples -> (num_codebooks, frames) int64 codes on the CPU."""
        return self.start([samples])[0].result()

    def start(self, clips: list[np.ndarray]) -> list[EncodeHandle]:
        """Start encoding clips of 44.1 kHz mono float32 samples together, one handle per clip: on
        CUDA on the encoder's own stream (the handles are ready once it finished), elsewhere at once.
        More than one clip: at most max_batch, none longer than max_frames."""
        frames = [self.frames_of(len(samples)) for samples in clips]
        if not clips or min(frames) == 0:
            raise ValueError("a reference clip needs at least one sample")
        if len(clips) > 1 and (len(clips) > self.max_batch or max(frames) > self.max_frames):
            raise ValueError(f"a batch holds at most {self.max_batch} clips of at most {self.max_frames} frames, "
                             f"got {len(clips)} of up to {max(frames)}")
        # Shared clips are read-only: copied then.
        rows = [torch.from_numpy(np.require(samples, np.float32, ["C", "W"])) for samples in clips]
        if self._stream is None or max(frames) > self.max_frames:
            codes = self._encode([row.to(self.device) for row in rows], max(frames)).cpu()
            return [EncodeHandle(codes[i, :, :n]) for i, n in enumerate(frames)]
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            host = [row.pin_memory() for row in rows]
            codes = self._encode([row.to(self.device, non_blocking=True) for row in host], max(frames))
            out = torch.empty(codes.shape, dtype=codes.dtype, pin_memory=True)
            out.copy_(codes, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        return [EncodeHandle(out[i, :, :n], done, keep=(host,)) for i, n in enumerate(frames)]

    def _encode(self, rows: list[torch.Tensor], frames: int) -> torch.Tensor:
        """(bucket, num_codebooks, chunks * the bucket's chunk frames) codes of the rows (padded to the
        longest, a whole number of chunks) on the device, on the current stream; rows past len(rows)
        are silence. A clip longer than max_frames: (1, num_codebooks, its frames)."""
        with torch.inference_mode():
            if frames > self.max_frames:
                # Longer than reserved (one clip): a fresh encoder, whose RoPE tables may grow (growing
                # this one's would free the table its graph reads).
                return encode_chunked(self.codec, rows[0].view(1, 1, -1), self.chunk_frames)
            batch = next(b for b in self.batches if b >= len(rows))
            chunk_samples = self.chunk_samples(batch)
            length = -(-frames * self.codec.config.frame_length // chunk_samples) * chunk_samples
            audio = torch.zeros(batch, 1, length, device=rows[0].device)
            for i, row in enumerate(rows):
                audio[i, 0, :row.shape[-1]] = row
            encoder = self._encoders[batch]
            encoder.reset()
            graph = self._graphs.get(batch)
            codes = []
            for start in range(0, length, chunk_samples):
                chunk = audio[..., start:start + chunk_samples]
                if graph is None:
                    codes.append(encoder.step(chunk))
                    continue
                replay, chunk_in, chunk_codes = graph
                chunk_in.copy_(chunk)
                replay.replay()
                codes.append(chunk_codes.clone())
        return torch.cat(codes, -1)
