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
it). The encoder's units keep the module's own ops, so that reference codes stay the reference
implementation's. With Triton on CUDA the engine streams the decoder channels-last instead
(Decoder.use_channels_last, engine/model/channels_last_decoder.py): a residual unit is then two kernels.

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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    LayerWeights,
    ModdedDAC,
    ResidualUnit,
    Snake1d,
    WindowLimitedTransformer,
    WNConv,
    biased_residual,
    biased_snake,
    context_snake,
    layer_forward,
    layer_weights,
    rope_table,
    weight_norm,
)
from .tuned_conv import ShapeTunedConv1d

__all__ = ["Rows", "StreamingDecoder", "StreamingEncoder", "decode_chunked", "encode_chunked"]

MAX_POSITIONS = 2**24  # fp32 represents every integer position up to here


@dataclass(frozen=True)
class Rows:
    """Which of a decoder's B streams a call continues: the same indices on the device and the host."""

    index: Tensor  # (b,) int64 on the state's device
    host: np.ndarray  # (b,) int64

    @classmethod
    def of(cls, rows: Sequence[int], device) -> "Rows":
        host = np.asarray(rows, dtype=np.int64)
        return cls(torch.from_numpy(host).to(device, non_blocking=True), host)


class _Streamer:
    """One layer's streaming forward: step(x (b, C, n), rows) -> y for exactly those n steps.

    rows: which of the B streams the b inputs continue, None for all of them in order. Every
    stateful streamer reads and writes its state through `_read` / `_write` / `_zero`."""

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        raise NotImplementedError

    def reset(self, rows: Rows | None) -> None:
        pass

    def children(self) -> list["_Streamer"]:
        return []


def _read(state: Tensor, rows: Rows | None) -> Tensor:
    return state if rows is None else state[rows.index]


def _write(state: Tensor, rows: Rows | None, value: Tensor) -> None:
    if rows is None:
        state.copy_(value)
    else:
        state[rows.index] = value.to(state.dtype)


def _zero(state: Tensor, rows: Rows | None) -> None:
    if rows is None:
        state.zero_()
    else:
        state.index_fill_(0, rows.index, 0)  # a scalar argument: no host copy, so capturable


class _Stateless(_Streamer):
    def __init__(self, module: nn.Module):
        self.module = module

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        return self.module(x)


class _Sequence(_Streamer):
    def __init__(self, parts: list[_Streamer]):
        self.parts = parts

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        for p in self.parts:
            x = p.step(x, rows)
        return x

    def reset(self, rows: Rows | None) -> None:
        for p in self.parts:
            p.reset(rows)

    def children(self) -> list[_Streamer]:
        return self.parts


class _Residual(_Streamer):
    """ResidualUnit: x + block(x)."""

    def __init__(self, block: _Streamer):
        self.block = block

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        return x + self.block.step(x, rows)

    def reset(self, rows: Rows | None) -> None:
        self.block.reset(rows)

    def children(self) -> list[_Streamer]:
        return [self.block]


class _FusedResidual(_Streamer):
    """ResidualUnit x + conv1(snake(conv7(snake(x)))) with the pointwise work fused (module docstring)."""

    def __init__(self, m: ResidualUnit, batch: int):
        first_snake, dilated, second_snake, pointwise = m.block
        convs = (dilated.conv, pointwise.conv)
        if (dilated.stride != 1 or pointwise.left_pad or _weight(pointwise.conv).shape[-1] != 1
                or any(isinstance(c, nn.Conv1d) and (c.padding != (0,) or c.groups != 1) for c in convs)):
            raise TypeError("a fused residual unit expects an unpadded stride-1 causal conv, then a 1x1 conv")
        self.m = m
        self.dilated = _Conv(dilated, batch)  # keeps the dilated conv's left context

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        first_snake, dilated, second_snake, pointwise = self.m.block
        full = self.dilated.with_context(
            x, rows, lambda context, new: context_snake(context, new, first_snake.alpha, first_snake.eps))
        y = _convolve_unbiased(dilated.conv, full)
        y = biased_snake(y, dilated.conv.bias, second_snake.alpha, second_snake.eps)
        y = torch.matmul(_weight(pointwise.conv).to(y.dtype)[..., 0], y)
        return biased_residual(x, y, pointwise.conv.bias)

    def reset(self, rows: Rows | None) -> None:
        self.dilated.reset(rows)

    def children(self) -> list[_Streamer]:
        return [self.dilated]


def _weight(conv: nn.Module) -> Tensor:
    """A Conv1d's or WNConv's (c_out, c_in, k) weight."""
    return weight_norm(*conv.g_v) if isinstance(conv, WNConv) else conv.weight


def _convolve_unbiased(conv: nn.Module, x: Tensor) -> Tensor:
    """conv(x) without its bias (a fused pointwise pass adds it)."""
    if isinstance(conv, ShapeTunedConv1d):
        return conv.convolve(x, None)
    if isinstance(conv, WNConv):
        return F.conv1d(x, _weight(conv).to(x.dtype), None, conv.stride, dilation=conv.dilation)
    return F.conv1d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)


def _state(batch: int, channels: int, length: int, like: nn.Module) -> Tensor:
    p = next(like.parameters())
    with torch.inference_mode(False):  # a normal tensor: updatable in place inside or outside inference mode
        return torch.zeros(batch, channels, length, device=p.device, dtype=p.dtype)


class _Conv(_Streamer):
    """CausalConv1d: keep the last k_eff - stride inputs; conv(cat(state, x)) has exactly n / stride outputs.

    A whole decode right-pads the last partial stride with zeros, which a stream cannot know it should
    do, so with stride > 1 every chunk must hold a whole number of strides (the decode path has none).
    """

    def __init__(self, m: CausalConv1d, batch: int):
        self.m = m
        conv = m.conv
        c_in = conv.g_v[1].shape[1] if isinstance(conv, WNConv) else conv.in_channels
        if isinstance(conv, nn.Conv1d) and conv.padding != (0,):
            raise TypeError("streaming CausalConv1d expects an unpadded inner conv")
        self.buf = _state(batch, c_in, m.left_pad, m)

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        if x.shape[-1] % self.m.stride:
            stride = self.m.stride
            raise ValueError(f"a stride-{stride} conv streams whole strides only, got {x.shape[-1]} steps")
        if self.buf.shape[-1] == 0:
            return self.m.conv(x)
        return self.m.conv(self.with_context(x, rows))

    def with_context(self, x: Tensor, rows: Rows | None, join=None) -> Tensor:
        """The left context, then x (join(context, x) when given, e.g. with x's Snake on the way);
        its last k_eff - stride steps are kept as the next call's context."""
        context = _read(self.buf, rows)
        full = join(context, x) if join is not None else torch.cat([context.to(x.dtype), x], -1)
        _write(self.buf, rows, full[..., full.shape[-1] - self.buf.shape[-1]:])
        return full

    def reset(self, rows: Rows | None) -> None:
        _zero(self.buf, rows)


class _ConvTranspose(_Streamer):
    """CausalConvTranspose1d: the whole decode trims k - stride samples on the right; here they are
    kept (without bias) and added to the start of the next chunk's output (overlap-add)."""

    def __init__(self, m: CausalConvTranspose1d, batch: int):
        self.m = m
        conv = m.conv
        if isinstance(conv, WNConv):
            v = conv.g_v[1]
            c_out, k = v.shape[1], v.shape[2]
        else:
            if (conv.padding, conv.output_padding, conv.dilation, conv.groups) != ((0,), (0,), (1,), 1):
                raise TypeError("streaming CausalConvTranspose1d expects a plain inner ConvTranspose1d")
            c_out, k = conv.out_channels, conv.kernel_size[0]
        self.stride = m.stride
        self.carry = _state(batch, c_out, max(k - self.stride, 0), m)

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        conv = self.m.conv
        w = weight_norm(*conv.g_v).to(x.dtype) if isinstance(conv, WNConv) else conv.weight
        y = F.conv_transpose1d(x, w, None, self.stride)  # (B, C, n * stride + k - stride)
        n_out, tail = x.shape[-1] * self.stride, self.carry.shape[-1]
        if tail:
            y[..., :tail] += _read(self.carry, rows).to(y.dtype)
            _write(self.carry, rows, y[..., n_out:])
        return y[..., :n_out] + conv.bias[:, None]

    def reset(self, rows: Rows | None) -> None:
        _zero(self.carry, rows)


class _ConvNeXt(_Streamer):
    """ConvNeXtBlock.forward with its depthwise conv streamed."""

    def __init__(self, m: ConvNeXtBlock, batch: int):
        self.m = m
        self.dwconv = _Conv(m.dwconv, batch)

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        m = self.m
        y = m.norm(self.dwconv.step(x, rows).transpose(1, 2))
        y = m.pwconv2(F.gelu(m.pwconv1(y)))
        return x + (m.gamma * y).transpose(1, 2)

    def reset(self, rows: Rows | None) -> None:
        self.dwconv.reset(rows)

    def children(self) -> list[_Streamer]:
        return [self.dwconv]


class _Transformer(_Streamer):
    """WindowLimitedTransformer with a rolling KV cache of the last window - 1 positions per layer.

    A chunk of n queries attends over [cache (window - 1 keys), its own n keys]. Query i (absolute
    position pos + i) and cache slot j (absolute position pos - (window - 1) + j) are window - 1 + i - j
    apart, so the band mask does not depend on pos; only "slot j holds a real position (>= 0)" does.
    Each stream (row) has its own position.
    """

    def __init__(self, m: WindowLimitedTransformer, batch: int, rope_base: float):
        self.m = m
        att = m.layers[0].attention if len(m.layers) else None
        self.window, self.rope_base = m.window_size, rope_base
        self.head_dim = att.head_dim if att else 0
        p = next(m.parameters())
        self.device = p.device
        shape = (batch, att.n_local_heads if att else 0, m.window_size - 1, self.head_dim)
        with torch.inference_mode(False):
            self.k_cache = [torch.zeros(shape, device=p.device, dtype=p.dtype) for _ in m.layers]
            self.v_cache = [torch.zeros(shape, device=p.device, dtype=p.dtype) for _ in m.layers]
            self.pos = torch.zeros(batch, dtype=torch.long, device=p.device)  # next absolute position per row
            self.table = m.freqs_cis.float()  # (rows, head_dim / 2, 2), the stored rows first
        # Host-side copy of pos: sizes the table, never read back from the device.
        self.frames = np.zeros(batch, dtype=np.int64)
        self.weights = [layer_weights(layer) for layer in m.layers]
        self.layer_forward = m.stream_layer or layer_forward

    def _ensure_table(self, end: int) -> None:
        if end <= self.table.shape[0]:
            return
        if end > MAX_POSITIONS:
            raise ValueError(
                f"codec stream position {end} is past {MAX_POSITIONS} frames, where fp32 RoPE positions "
                "stop being exact: reset() the decoder between utterances"
            )
        rows = min(max(end, 2 * self.table.shape[0]), MAX_POSITIONS)
        extra = rope_table(rows, self.head_dim, self.rope_base)[self.table.shape[0]:]
        with torch.inference_mode(False):
            self.table = torch.cat([self.table, extra.to(self.device).float()])

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        n, w1 = x.shape[-1], self.window - 1
        host_rows = slice(None) if rows is None else rows.host
        self._ensure_table(int(self.frames[host_rows].max()) + n)
        self.frames[host_rows] += n
        pos = _read(self.pos, rows)  # (b,)
        steps = torch.arange(n, device=x.device)
        rope = self.table[pos[:, None] + steps]  # (b, n, head_dim / 2, 2)
        slots = torch.arange(w1 + n, device=x.device)
        # band: 0 <= (w1 + i) - j < window; real: slot j's absolute position pos - w1 + j >= 0.
        band = (slots[None, :] >= steps[:, None]) & (slots[None, :] <= steps[:, None] + w1)
        mask = (band[None] & (slots[None, :] + pos[:, None] >= w1)[:, None, :])[:, None]  # (b, 1, n, w1 + n)
        _write(self.pos, rows, pos + n)
        h = x.transpose(1, 2)
        for i, weights in enumerate(self.weights):
            h, k, v = self.layer_forward(h, rope, mask, _read(self.k_cache[i], rows), _read(self.v_cache[i], rows), weights)
            _write(self.k_cache[i], rows, k)
            _write(self.v_cache[i], rows, v)
        return self.m.norm(h).transpose(1, 2)

    def reset(self, rows: Rows | None) -> None:
        for c in (*self.k_cache, *self.v_cache):
            _zero(c, rows)
        _zero(self.pos, rows)
        self.frames[slice(None) if rows is None else rows.host] = 0


def compiled_layer_forward(backend) -> Callable:
    """layer_forward through torch.compile, one graph for every layer, row count and chunk length
    of two frames or more (one more for a single row): the dims that vary between calls are marked
    dynamic, the weights' stay static. A chunk of one frame adds graphs of its own (a size of 1 is a
    constant to Dynamo, and the first layer's input strides then differ from the others'), and so
    does a call outside inference mode. Every wrapper's graphs count against one recompile limit
    (Dynamo keeps them on layer_forward's code; past the limit, fullgraph makes a call fail), so
    make one wrapper per process and backend (codec_runner.set_up_codec does)."""
    compiled = torch.compile(layer_forward, backend=backend, fullgraph=True)

    def forward(h: Tensor, rope: Tensor, mask: Tensor, k_cached: Tensor, v_cached: Tensor, w: LayerWeights):
        for tensor, dims in ((h, (0, 1)), (rope, (0, 1)), (mask, (0, 2, 3)), (k_cached, (0,)), (v_cached, (0,))):
            for dim in dims:  # rows; chunk length (the mask's keys: the cache's and the chunk's)
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
        return compiled(h, rope, mask, k_cached, v_cached, w)

    return forward


def _streamer(m: nn.Module, batch: int, rope_base: float, fuse_residuals: bool = False) -> _Streamer:
    """m's streaming forward; fuse_residuals: residual units as _FusedResidual (the decoder's)."""
    def inner(child: nn.Module) -> _Streamer:
        return _streamer(child, batch, rope_base, fuse_residuals)

    if isinstance(m, CausalConv1d):
        return _Conv(m, batch)
    if isinstance(m, CausalConvTranspose1d):
        return _ConvTranspose(m, batch)
    if isinstance(m, ConvNeXtBlock):
        return _ConvNeXt(m, batch)
    if isinstance(m, WindowLimitedTransformer):
        return _Transformer(m, batch, rope_base)
    if isinstance(m, ResidualUnit):
        return _FusedResidual(m, batch) if fuse_residuals else _Residual(inner(m.block))
    if isinstance(m, (DecoderBlock, EncoderBlock, Encoder)):
        return inner(m.block)
    if isinstance(m, Decoder):
        if m.channels_last is not None:
            from .channels_last_decoder import ChannelsLastDecoder  # it builds on this module

            return ChannelsLastDecoder(m, batch, m.channels_last)
        return inner(m.model)
    if type(m) is nn.Sequential:
        return _Sequence([inner(c) for c in m])
    if isinstance(m, (Snake1d, nn.Tanh, nn.Identity)):
        return _Stateless(m)
    raise TypeError(f"no streaming forward for {type(m).__name__}: the codec's architecture changed")


class StreamingDecoder:
    """Decode an utterance's codes in pieces of any sizes, carrying each layer's state.

    decode(codes (B, num_codebooks, n)) -> audio (B, 1, n * frame_length) fp32 for exactly those n
    frames; the concatenation over calls equals `codec.decode` of all frames at once. Each call costs
    only its own frames. The B rows are independent streams: a call may continue any subset of them
    (`rows`), so streams that started at different times decode together in one batched call.
    reset() starts new utterances. The codec's weights are used in place: do not move or cast the
    codec after building its decoder.

    CUDA graphs: a fixed chunk size can be captured once and replayed per chunk (measured on an H100
    with the S1-mini architecture in bf16: 2.5 ms per 1-frame chunk replayed, 14 ms eager; audio
    bit-identical). Replays advance the device state but not the host-side `frames` count, so keep a
    replayed stream within the RoPE table (block_size frames: 4096 for S1-mini, ~190 s).
    """

    def __init__(self, codec: ModdedDAC, batch: int = 1):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.codec, self.batch = codec, batch
        cfg = codec.config
        q, base = codec.quantizer, cfg.quantizer_transformer.rope_base
        self._post = _streamer(q.post_module, batch, base)
        self._up = _streamer(q.upsample, batch, base)
        self._dec = _streamer(codec.decoder, batch, base, fuse_residuals=True)

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
        _reserve([self._post, self._up, self._dec], frames)

    def _rows(self, rows: Sequence[int], device) -> Rows:
        if len(set(rows)) != len(rows) or any(not 0 <= r < self.batch for r in rows):
            raise ValueError(f"rows must be distinct indices below {self.batch}, got {list(rows)}")
        return Rows.of(rows, device)


def _reserve(streamers: list[_Streamer], positions: int) -> None:
    """Grow every transformer's RoPE table below `streamers` to `positions` rows now."""
    pending = list(streamers)
    while pending:
        streamer = pending.pop()
        if isinstance(streamer, _Transformer):
            streamer._ensure_table(positions)
        pending.extend(streamer.children())


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
        self._encoder = _streamer(codec.encoder, batch, cfg.encoder_transformer.rope_base)
        self._downsample = _streamer(q.downsample, batch, cfg.quantizer_transformer.rope_base)
        self._pre_module = _streamer(q.pre_module, batch, cfg.quantizer_transformer.rope_base)

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
        _reserve([self._encoder], frames * cfg.frame_length // cfg.hop_length)
        _reserve([self._downsample, self._pre_module], frames)


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
    Same codes up to rounding: exact on the CPU in fp32 (tested); on an H100, where cuDNN runs fp32
    convolutions in TF32, chunk sizes 64 and 32 gave a few different codes for a 10 s clip (the sum
    of its codes moved by 0.005 %; 0.07 % with the codec's transformers in int8).
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
