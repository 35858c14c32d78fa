"""Reference clips -> codes, a fixed number of frames at a time; on CUDA each chunk is one graph replay.

Encoding a clip eagerly launches ~1,300 kernels per 32-frame chunk from Python, several times the
clip's GPU time, and more inside a busy server, where the worker thread that encodes also runs every
decode step. The chunk's graph replays the same kernels with one launch: the same codes. Every chunk, the last one included, has the same size: the last is padded with zeros,
which the causal encoder sees only after the clip's real frames, whose codes are kept.

On CUDA a clip encodes on a stream of its own (`start`): the worker thread goes on stepping the
running sequences, whose steps the encode's kernels share the GPU with, instead of waiting ~50 ms
for each new voice. Encodes started one after another run in order on that stream; the engine
starts one at a time (clip_encodes.ENCODES_IN_FLIGHT), since a burst of them queued at once filled the
GPU's command buffer and held up every launch behind them.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

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


class ReferenceEncoder:
    """One streaming encoder and, after prepare(), its chunk graph. Stateful: call it from one thread
    at a time (the engine's GPU worker)."""

    def __init__(self, codec: ModdedDAC, chunk_frames: int, max_frames: int):
        """chunk_frames: frames encoded at a time (bounds the activations held at once); max_frames:
        the longest clip, in frames, that a graph replay may encode."""
        self.codec, self.chunk_frames, self.max_frames = codec, chunk_frames, max_frames
        self.device = next(codec.parameters()).device
        self.encoder = StreamingEncoder(codec)
        # Replays run whole chunks, so the longest clip reaches its last chunk's padded end.
        self.encoder.reserve(-(-max_frames // chunk_frames) * chunk_frames)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None

    @property
    def chunk_samples(self) -> int:
        return self.chunk_frames * self.codec.config.frame_length

    def prepare(self) -> float:
        """Capture the chunk's graph (CUDA only) on the encoder's own stream, the one it replays on.
        A graph keeps the cuBLAS workspace of the stream it was captured on (see cuda_graphs.capture),
        and torch hands out streams from a small pool in turn, so a stream taken for the capture alone
        could later be another runner's, whose matmuls would share that workspace during a replay.
        Returns the seconds it took."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device; the codec is on {self.device}: encode eagerly")
        started = time.perf_counter()
        self._input = torch.zeros(1, 1, self.chunk_samples, device=self.device)
        with torch.inference_mode():
            graph, self._output = capture(lambda: self.encoder.step(self._input), self._stream)
        self._graph = graph
        self.encoder.reset()
        return time.perf_counter() - started

    def encode(self, samples: np.ndarray) -> torch.Tensor:
        """44.1 kHz mono float32 samples -> (num_codebooks, frames) int64 codes on the CPU."""
        return self.start(samples).result()

    def start(self, samples: np.ndarray) -> EncodeHandle:
        """Start encoding 44.1 kHz mono float32 samples: on CUDA on the encoder's own stream (the
        handle is ready once it finished), elsewhere at once."""
        frame_length = self.codec.config.frame_length
        frames = -(-len(samples) // frame_length)
        if frames == 0:
            raise ValueError("a reference clip needs at least one sample")
        host = torch.from_numpy(np.require(samples, np.float32, ["C", "W"]))  # shared clips are read-only: copied then
        if self._stream is None or frames > self.max_frames:
            return EncodeHandle(self._encode(host.to(self.device), frames).cpu()[0, :, :frames])
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            host = host.pin_memory()
            codes = self._encode(host.to(self.device, non_blocking=True), frames)
            out = torch.empty(codes.shape, dtype=codes.dtype, pin_memory=True)
            out.copy_(codes, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        return EncodeHandle(out[0, :, :frames], done, keep=(host,))

    def _encode(self, samples: torch.Tensor, frames: int) -> torch.Tensor:
        """(1, num_codebooks, chunks * chunk_frames) codes of samples on the device, on the current stream."""
        audio = F.pad(samples.view(1, 1, -1), (0, -samples.shape[-1] % self.chunk_samples))
        with torch.inference_mode():
            if frames > self.max_frames:
                # Longer than reserved: a fresh encoder, whose RoPE tables may grow (growing this one's
                # would free the table its graph reads).
                return encode_chunked(self.codec, audio, self.chunk_frames)
            self.encoder.reset()
            codes = []
            for start in range(0, audio.shape[-1], self.chunk_samples):
                chunk = audio[..., start:start + self.chunk_samples]
                if self._graph is None:
                    codes.append(self.encoder.step(chunk))
                    continue
                self._input.copy_(chunk)
                self._graph.replay()
                codes.append(self._output.clone())
        return torch.cat(codes, -1)
