"""Exact streaming decode for the modded-DAC codec: codes arrive a few frames at a time, audio leaves
for exactly those frames, and the concatenation equals `ModdedDAC.decode` of the whole utterance
(up to float rounding).

Every layer of the decode path is causal, so each one streams with carried state instead of
recomputed left context:
  CausalConv1d            the last k_eff - stride input samples (a fixed-size buffer)
  CausalConvTranspose1d   the k - stride output samples that spill past the chunk (overlap-add)
  ConvNeXtBlock           its causal depthwise conv streams as above; the rest is pointwise
  ResidualUnit            x + block(x); in the decoder, with its pointwise work fused (below)
  WindowLimitedTransformer  per layer a rolling KV cache of the last window - 1 positions (after
                          RoPE), positions continuing across calls as in a whole decode (0..T-1);
                          a layer is `layer_forward` on the layer's parameters, which the engine
                          compiles for the quantizer's post-transformer (codec_runner.set_up_codec)
  Snake1d, Tanh           stateless
The streamers walk the codec's own module tree and call its modules or their parameters (weights
shared, nothing copied); an unknown module type is an error, so an architecture change cannot stream
silently wrong.

The decoder's residual units (most of its work) stream as convolutions without their biases and
three pointwise passes: Snake into the dilated conv's left context, bias + Snake, bias + residual;
the 1x1 conv is a matmul, which needs no layout change (cuDNN converts NCHW to NHWC and back around
it), in TF32 where cuDNN's convolutions are; a Snake just before a conv goes into that conv's left
context the same way. The encoder's units keep the module's own ops, so that reference codes are the
reference implementation's, unless the engine compiles them (Encoder.stream_pointwise_with): fused as the
decoder's, each pass one kernel, the codes then equal up to VQ near-ties. With Triton on CUDA the
engine streams the decoder channels-last instead (Decoder.use_channels_last,
engine/model/channels_last_decoder.py): a residual unit is then two kernels.

State lives in buffers of fixed shape updated in place, the transformer's position is a device
tensor, and the per-chunk path makes no host syncs, so a chunk of fixed size can be captured in a
CUDA graph. The one host-side decision is growing the RoPE table when the stream passes its end
(see below); it happens at most log2 times per stream.

RoPE past the table end. A whole decode uses rows 0..T-1 of the bf16 table stored in the checkpoint
(block_size rows, 4096 for S1-mini = ~190 s) and cannot go further. The streamer uses the stored rows
while they last, then rows built by the same formula the table was built with (`rope_table`: fp32
angles, cos/sin, rounded to bf16). A stream longer than block_size therefore equals a whole decode by
a codec whose table were longer (tested), and attention, which sees only the last window positions,
stays in the regime the model runs in everywhere else: the bf16 rounding noise of the table is of the
same size at every position. fp32 angles lose accuracy slowly with the position (at 1e5 frames, ~77
min, the angle error is ~0.004 rad, the size of the bf16 rounding); past 2**24 frames (~9 days) the
positions are no longer exact in fp32 and decode() raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .codec import ModdedDAC
from .codec_streamers import EAGER_POINTWISE, reserve_positions, streamer_for
from .stream_state import Rows

__all__ = ["StreamingDecoder", "StreamingEncoder", "decode_chunked", "encode_chunked"]


class StreamingDecoder:
    """Decode an utterance's codes in pieces of any sizes, carrying each layer's state.

    decode(codes (B, num_codebooks, n)) -> audio (B, 1, n * frame_length) fp32 for exactly those n
    frames; the concatenation over calls equals `codec.decode` of all frames at once. Each call costs
    only its own frames. The B rows are independent streams: a call may continue any subset of them
    (`rows`), so streams that started at different times decode together in one batched call.
    reset() starts new utterances. The codec's weights are used in place: do not move or cast the
    codec after building its decoder.

    CUDA graphs: a fixed chunk size can be captured once and replayed per chunk (several times faster
    than eager for small chunks; audio bit-identical). Replays advance the device state but not the host-side `frames` count, so keep a
    replayed stream within the RoPE table (block_size frames: 4096 for S1-mini, ~190 s).
    """

    def __init__(self, codec: ModdedDAC, batch: int = 1):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.codec, self.batch = codec, batch
        cfg = codec.config
        q, base = codec.quantizer, cfg.quantizer_transformer.rope_base
        self._post = streamer_for(q.post_module, batch, base)
        self._up = streamer_for(q.upsample, batch, base)
        self._dec = streamer_for(codec.decoder, batch, base, EAGER_POINTWISE)

    @property
    def frames(self) -> np.ndarray:
        """Frames decoded since each row's last reset, (B,)."""
        return self._post.frames.copy()

    @torch.no_grad()
    def decode(self, codes: Tensor, rows: Sequence[int] | None = None) -> Tensor:
        """codes (b, num_codebooks, n) continuing streams `rows` (distinct indices below B; None: all B
        rows in order) -> audio (b, 1, n * frame_length) fp32."""
        cfg = self.codec.config
        expected = self.batch if rows is None else len(rows)
        if codes.dim() != 3 or codes.shape[1] != cfg.num_codebooks or codes.shape[0] != expected:
            raise ValueError(f"codes must be ({expected}, {cfg.num_codebooks}, n), got {tuple(codes.shape)}")
        return self.decode_rows(codes, None if rows is None else self._rows(rows, codes.device))

    @torch.no_grad()
    def decode_rows(self, codes: Tensor, selected: Rows | None) -> Tensor:
        """decode() with the rows already on the device, unchecked: capturable in a CUDA graph (with
        the tables reserved beforehand, see reserve())."""
        n = codes.shape[-1]
        if n == 0:
            return torch.zeros(codes.shape[0], 1, 0, device=codes.device)
        z = self.codec.quantizer.codebook_sum(codes.long())
        z = self._up.step(self._post.step(z, selected), selected)
        return self._dec.step(z, selected).float()

    def reset(self, rows: Sequence[int] | None = None) -> None:
        """Start new utterances in `rows` (None: every row)."""
        self.reset_rows(None if rows is None else self._rows(rows, self._post.device))

    def reset_rows(self, selected: Rows | None) -> None:
        """reset() with the rows already on the device, unchecked: capturable in a CUDA graph."""
        for s in (self._post, self._up, self._dec):
            s.reset(selected)

    @property
    def positions(self) -> Tensor:
        """A copy of each row's next transformer position, (B,) on the device. Unlike `frames`, which
        only decode() counts, it includes what graph replays of decode_rows() advanced."""
        return self._post.pos.clone()

    def reserve(self, frames: int) -> None:
        """Build the RoPE tables for streams of up to `frames` frames now, so that no decode call
        grows them (a captured graph replays without the host-side code that would)."""
        reserve_positions([self._post, self._up, self._dec], frames)

    def _rows(self, rows: Sequence[int], device) -> Rows:
        if len(set(rows)) != len(rows) or any(not 0 <= r < self.batch for r in rows):
            raise ValueError(f"rows must be distinct indices below {self.batch}, got {list(rows)}")
        return Rows.of(rows, device)


class StreamingEncoder:
    """Encode clips chunk by chunk with carried state: step(audio (B, 1, n)) -> codes (B,
    num_codebooks, n / frame_length), n a whole number of frames; reset() starts new clips.

    The encode path (encoder, downsample, pre_module) is causal like the decode path, and the VQ
    works frame by frame, so the codes equal one whole encode while the activations held at once
    are those of one chunk. Chunks hold whole frames, so every strided conv sees whole strides. A
    fixed chunk size can be captured in a CUDA graph (reserve() the RoPE tables first).
    """

    def __init__(self, codec: ModdedDAC, batch: int = 1):
        cfg, q = codec.config, codec.quantizer
        self.codec = codec
        self._encoder = streamer_for(codec.encoder, batch, cfg.encoder_transformer.rope_base,
                                     codec.encoder.stream_pointwise)
        self._downsample = streamer_for(q.downsample, batch, cfg.quantizer_transformer.rope_base)
        self._pre_module = streamer_for(q.pre_module, batch, cfg.quantizer_transformer.rope_base)

    @torch.no_grad()
    def step(self, audio: Tensor) -> Tensor:
        if audio.shape[-1] % self.codec.config.frame_length:
            raise ValueError(f"a chunk holds whole frames of {self.codec.config.frame_length} samples, "
                             f"got {audio.shape[-1]}")
        z = self._encoder.step(audio.to(self.codec.dtype), None)
        return self.codec.quantizer.quantize_latent(self._pre_module.step(self._downsample.step(z, None), None))

    def reset(self) -> None:
        for s in (self._encoder, self._downsample, self._pre_module):
            s.reset(None)

    def reserve(self, frames: int) -> None:
        """Build the RoPE tables for clips of up to `frames` frames now (see StreamingDecoder.reserve).
        The encoder's transformer runs at the hop rate (4 positions per frame for S1-mini), the
        quantizer's at the frame rate."""
        cfg = self.codec.config
        reserve_positions([self._encoder], frames * cfg.frame_length // cfg.hop_length)
        reserve_positions([self._downsample, self._pre_module], frames)


def decode_chunked(codec: ModdedDAC, codes: Tensor, chunk_frames: int | Iterable[int]) -> Tensor:
    """Stream codes (B, num_codebooks, T) through a fresh StreamingDecoder and concatenate the audio.

    chunk_frames: one size, or sizes taken in turn (repeated as needed); the last piece is what is left.
    """
    sizes = [chunk_frames] if isinstance(chunk_frames, int) else list(chunk_frames)
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"chunk sizes must be >= 1, got {chunk_frames!r}")
    dec = StreamingDecoder(codec, batch=codes.shape[0])
    out, t, i, T = [], 0, 0, codes.shape[-1]
    while t < T:
        n = sizes[i % len(sizes)]
        out.append(dec.decode(codes[..., t : t + n]))
        t, i = t + n, i + 1
    if not out:
        out.append(dec.decode(codes))
    return torch.cat(out, -1)


def encode_chunked(codec: ModdedDAC, audio: Tensor, chunk_frames: int) -> Tensor:
    """`codec.encode` of a whole clip, computed chunk_frames frames at a time by a StreamingEncoder.

    A 10 s reference in fp32 needs ~0.6 GB of activations at once; in chunks, those of one chunk.
    Same codes up to rounding: exact on the CPU in fp32 (tested); on GPUs where cuDNN runs fp32
    convolutions in TF32, different chunk sizes can give a few different codes for a clip.
    """
    if audio.dim() != 3 or audio.shape[1] != 1 or audio.shape[-1] == 0:
        raise ValueError(f"audio must be (B, 1, n) with n > 0, got {tuple(audio.shape)}")
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    frame_length = codec.config.frame_length
    audio = F.pad(audio, (0, -audio.shape[-1] % frame_length))
    encoder = StreamingEncoder(codec, batch=audio.shape[0])
    step = chunk_frames * frame_length
    return torch.cat([encoder.step(audio[..., start:start + step]) for start in range(0, audio.shape[-1], step)], -1)
