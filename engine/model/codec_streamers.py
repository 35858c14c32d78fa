"""The streaming forward of every layer of the codec's decode and encode paths (see codec_stream):
each carries its state between calls, so that a stream of chunks equals one whole call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import sdpa_kernel

from ..compiled_regions import compile_region
from .channels_last_decoder import ChannelsLastDecoder
from .codec import Decoder, DecoderBlock, Encoder, EncoderBlock
from .codec_convs import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    ResidualUnit,
    Snake1d,
    WNConv,
    biased_residual,
    biased_snake,
    context_snake,
    matmuls_round_like_convs,
    weight_norm,
)
from .codec_transformer import WindowLimitedTransformer, layer_forward, layer_weights
from .layers import PLAN_FREE_ATTENTION, rope_table
from .stream_state import Rows, conv_weight, new_state, read_rows, write_rows, zero_rows
from .tuned_conv import ShapeTunedConv1d

MAX_POSITIONS = 2**24  # fp32 represents every integer position up to here


class Streamer:
    """One layer's streaming forward: step(x (b, C, n), rows) -> y for exactly those n steps.

    rows: which of the B streams the b inputs continue, None for all of them in order. Every
    stateful streamer reads and writes its state through `read_rows` / `write_rows` / `zero_rows`."""

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        raise NotImplementedError

    def reset(self, rows: Rows | None) -> None:
        pass

    def children(self) -> list["Streamer"]:
        return []


class _Stateless(Streamer):
    def __init__(self, module: nn.Module):
        self.module = module

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        return self.module(x)


class _Sequence(Streamer):
    def __init__(self, parts: list[Streamer]):
        self.parts = parts

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        for p in self.parts:
            x = p.step(x, rows)
        return x

    def reset(self, rows: Rows | None) -> None:
        for p in self.parts:
            p.reset(rows)

    def children(self) -> list[Streamer]:
        return self.parts


class _Residual(Streamer):
    """ResidualUnit: x + block(x)."""

    def __init__(self, block: Streamer):
        self.block = block

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        return x + self.block.step(x, rows)

    def reset(self, rows: Rows | None) -> None:
        self.block.reset(rows)

    def children(self) -> list[Streamer]:
        return [self.block]


@dataclass(frozen=True)
class PointwiseOps:
    """The pointwise passes of a fused residual unit (codec_convs' functions, or those compiled)."""

    context_snake: Callable  # (context, x, alpha, eps) -> cat(context, snake(x)) in time
    biased_snake: Callable  # (x, bias, alpha, eps) -> snake(x + bias)
    biased_residual: Callable  # (x, y, bias) -> x + (y + bias)


EAGER_POINTWISE = PointwiseOps(context_snake, biased_snake, biased_residual)


def compiled_pointwise(backend) -> PointwiseOps:
    """The pointwise passes through torch.compile, each one kernel, one graph for every row count
    above one, channel count and chunk length (marked dynamic; a size of 1 is a graph of its own). Make
    one per process and backend (codec_runner.set_up_codec does): the graphs of every wrapper of a
    function count against one recompile limit."""
    def compiled(fn, dynamic_dims):
        def mark(args) -> list[Tensor]:
            for tensor, dims in zip(args, dynamic_dims):
                for dim in dims:
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
            return list(args)

        inner = compile_region(fn, backend, mark)

        def run(*args):
            # The Snakes' alphas and the convs' biases as plain tensors: Dynamo keeps a parameter's
            # shape static, which would pin the channel count and compile a graph per block width.
            return inner(*(a.detach() if isinstance(a, nn.Parameter) else a for a in args))

        return run

    rows_channels_steps, per_channel = (0, 1, 2), (1,)
    return PointwiseOps(compiled(context_snake, (rows_channels_steps, rows_channels_steps, per_channel)),
                        compiled(biased_snake, (rows_channels_steps, (0,), per_channel)),
                        compiled(biased_residual, (rows_channels_steps, rows_channels_steps, (0,))))


def _snake_on_the_way(ops: PointwiseOps, snake: Snake1d) -> Callable[[Tensor, Tensor], Tensor]:
    """A conv's join (_Conv.with_context) that applies `snake` to the new steps as they go in after
    the left context: one pointwise pass (PointwiseOps.context_snake)."""
    return lambda context, new: ops.context_snake(context, new, snake.alpha, snake.eps)


class _FusedResidual(Streamer):
    """ResidualUnit x + conv1(snake(conv7(snake(x)))) with the pointwise work fused (module docstring)."""

    def __init__(self, m: ResidualUnit, batch: int, ops: PointwiseOps):
        first_snake, dilated, second_snake, pointwise = m.block
        convs = (dilated.conv, pointwise.conv)
        if (dilated.stride != 1 or pointwise.left_pad or conv_weight(pointwise.conv).shape[-1] != 1
                or any(isinstance(c, nn.Conv1d) and (c.padding != (0,) or c.groups != 1) for c in convs)):
            raise TypeError("a fused residual unit expects an unpadded stride-1 causal conv, then a 1x1 conv")
        self.m, self.ops = m, ops
        self.dilated = _Conv(dilated, batch)  # keeps the dilated conv's left context

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        first_snake, dilated, second_snake, pointwise = self.m.block
        ops = self.ops
        full = self.dilated.with_context(x, rows, _snake_on_the_way(ops, first_snake))
        y = _convolve_unbiased(dilated.conv, full)
        y = ops.biased_snake(y, dilated.conv.bias, second_snake.alpha, second_snake.eps)
        with matmuls_round_like_convs():
            y = torch.matmul(conv_weight(pointwise.conv).to(y.dtype)[..., 0], y)
        return ops.biased_residual(x, y, pointwise.conv.bias)

    def reset(self, rows: Rows | None) -> None:
        self.dilated.reset(rows)

    def children(self) -> list[Streamer]:
        return [self.dilated]


def _convolve_unbiased(conv: nn.Module, x: Tensor) -> Tensor:
    """conv(x) without its bias (a fused pointwise pass adds it)."""
    if isinstance(conv, ShapeTunedConv1d):
        return conv.convolve(x, None)
    if isinstance(conv, WNConv):
        return F.conv1d(x, conv_weight(conv).to(x.dtype), None, conv.stride, dilation=conv.dilation)
    return F.conv1d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)


class _Conv(Streamer):
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
        self.buf = new_state(batch, c_in, m.left_pad, m)

    def step(self, x: Tensor, rows: Rows | None, join=None) -> Tensor:
        """The conv over the left context then x (join(context, x) when given, see with_context)."""
        if x.shape[-1] % self.m.stride:
            stride = self.m.stride
            raise ValueError(f"a stride-{stride} conv streams whole strides only, got {x.shape[-1]} steps")
        if self.buf.shape[-1] == 0 and join is None:
            return self.m.conv(x)
        return self.m.conv(self.with_context(x, rows, join))

    def with_context(self, x: Tensor, rows: Rows | None, join=None) -> Tensor:
        """The left context, then x (join(context, x) when given, e.g. with x's Snake on the way);
        its last k_eff - stride steps are kept as the next call's context."""
        context = read_rows(self.buf, rows)
        full = join(context, x) if join is not None else torch.cat([context.to(x.dtype), x], -1)
        write_rows(self.buf, rows, full[..., full.shape[-1] - self.buf.shape[-1]:])
        return full

    def reset(self, rows: Rows | None) -> None:
        zero_rows(self.buf, rows)


class _SnakeThenConv(Streamer):
    """Snake1d then CausalConv1d, the Snake applied on the way into the conv's left context: one
    pointwise pass (PointwiseOps.context_snake) instead of the Snake's and the concatenation's."""

    def __init__(self, snake: Snake1d, conv: CausalConv1d, batch: int, ops: PointwiseOps):
        self.snake, self.ops = snake, ops
        self.conv = _Conv(conv, batch)

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        return self.conv.step(x, rows, _snake_on_the_way(self.ops, self.snake))

    def reset(self, rows: Rows | None) -> None:
        self.conv.reset(rows)

    def children(self) -> list[Streamer]:
        return [self.conv]


class _ConvTranspose(Streamer):
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
        self.carry = new_state(batch, c_out, max(k - self.stride, 0), m)

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        conv = self.m.conv
        w = weight_norm(*conv.g_v).to(x.dtype) if isinstance(conv, WNConv) else conv.weight
        y = F.conv_transpose1d(x, w, None, self.stride)  # (B, C, n * stride + k - stride)
        n_out, tail = x.shape[-1] * self.stride, self.carry.shape[-1]
        if tail:
            y[..., :tail] += read_rows(self.carry, rows).to(y.dtype)
            write_rows(self.carry, rows, y[..., n_out:])
        return y[..., :n_out] + conv.bias[:, None]

    def reset(self, rows: Rows | None) -> None:
        zero_rows(self.carry, rows)


class _ConvNeXt(Streamer):
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

    def children(self) -> list[Streamer]:
        return [self.dwconv]


class _Transformer(Streamer):
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
        extra = rope_table(rows, self.head_dim, self.rope_base, negative_power=True)[self.table.shape[0]:]
        with torch.inference_mode(False):
            self.table = torch.cat([self.table, extra.to(self.device).float()])

    def step(self, x: Tensor, rows: Rows | None) -> Tensor:
        n, w1 = x.shape[-1], self.window - 1
        host_rows = slice(None) if rows is None else rows.host
        self._ensure_table(int(self.frames[host_rows].max()) + n)
        self.frames[host_rows] += n
        pos = read_rows(self.pos, rows)  # (b,)
        steps = torch.arange(n, device=x.device)
        rope = self.table[pos[:, None] + steps]  # (b, n, head_dim / 2, 2)
        slots = torch.arange(w1 + n, device=x.device)
        # band: 0 <= (w1 + i) - j < window; real: slot j's absolute position pos - w1 + j >= 0.
        band = (slots[None, :] >= steps[:, None]) & (slots[None, :] <= steps[:, None] + w1)
        mask = (band[None] & (slots[None, :] + pos[:, None] >= w1)[:, None, :])[:, None]  # (b, 1, n, w1 + n)
        write_rows(self.pos, rows, pos + n)
        h = x.transpose(1, 2)
        with sdpa_kernel(PLAN_FREE_ATTENTION):  # see layer_forward
            for i, weights in enumerate(self.weights):
                h, k, v = self.layer_forward(h, rope, mask, read_rows(self.k_cache[i], rows),
                                             read_rows(self.v_cache[i], rows), weights)
                write_rows(self.k_cache[i], rows, k)
                write_rows(self.v_cache[i], rows, v)
        return self.m.norm(h).transpose(1, 2)

    def reset(self, rows: Rows | None) -> None:
        for c in (*self.k_cache, *self.v_cache):
            zero_rows(c, rows)
        zero_rows(self.pos, rows)
        self.frames[slice(None) if rows is None else rows.host] = 0


def compiled_layer_forward(backend) -> Callable:
    """layer_forward through torch.compile, one graph for every layer, row count and chunk length
    of two frames or more (one more for a single row): the dims that vary between calls are marked
    dynamic, the weights' stay static. A chunk of one frame adds graphs of its own (a size of 1 is a
    constant to Dynamo, and the first layer's input strides then differ from the others'), and so
    does a call outside inference mode. Every wrapper's graphs count against one recompile limit
    (Dynamo keeps them on layer_forward's code; past the limit, fullgraph makes a call fail), so
    make one wrapper per process and backend (codec_runner.set_up_codec does)."""
    def mark(args) -> list[Tensor]:
        h, rope, mask, k_cached, v_cached, _ = args
        for tensor, dims in ((h, (0, 1)), (rope, (0, 1)), (mask, (0, 2, 3)), (k_cached, (0,)), (v_cached, (0,))):
            for dim in dims:  # rows; chunk length (the mask's keys: the cache's and the chunk's)
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
        torch._dynamo.mark_static(rope, [2, 3])  # the head dim, which layer_forward reads the head layout from
        return [h, rope, mask, k_cached, v_cached]

    return compile_region(layer_forward, backend, mark)


def streamer_for(m: nn.Module, batch: int, rope_base: float, pointwise: PointwiseOps | None = None) -> Streamer:
    """m's streaming forward; with `pointwise`, residual units as _FusedResidual and a Snake before a
    conv as _SnakeThenConv, with those passes (the decoder's, and the encoder's when compiled), else as
    the module's own ops."""
    def inner(child: nn.Module) -> Streamer:
        return streamer_for(child, batch, rope_base, pointwise)

    if isinstance(m, CausalConv1d):
        return _Conv(m, batch)
    if isinstance(m, CausalConvTranspose1d):
        return _ConvTranspose(m, batch)
    if isinstance(m, ConvNeXtBlock):
        return _ConvNeXt(m, batch)
    if isinstance(m, WindowLimitedTransformer):
        return _Transformer(m, batch, rope_base)
    if isinstance(m, ResidualUnit):
        return _FusedResidual(m, batch, pointwise) if pointwise is not None else _Residual(inner(m.block))
    if isinstance(m, (DecoderBlock, EncoderBlock, Encoder)):
        return inner(m.block)
    if isinstance(m, Decoder):
        if m.channels_last is not None:
            return ChannelsLastDecoder(m, batch, m.channels_last)
        return inner(m.model)
    if type(m) is nn.Sequential:
        parts, children = [], list(m)
        while children:
            child = children.pop(0)
            if pointwise is not None and isinstance(child, Snake1d) and children and isinstance(children[0], CausalConv1d):
                parts.append(_SnakeThenConv(child, children.pop(0), batch, pointwise))
            else:
                parts.append(inner(child))
        return _Sequence(parts)
    if isinstance(m, (Snake1d, nn.Tanh, nn.Identity)):
        return _Stateless(m)
    raise TypeError(f"no streaming forward for {type(m).__name__}: the codec's architecture changed")


def reserve_positions(streamers: list[Streamer], positions: int) -> None:
    """Grow every transformer's RoPE table below `streamers` to `positions` rows now."""
    pending = list(streamers)
    while pending:
        streamer = pending.pop()
        if isinstance(streamer, _Transformer):
            streamer._ensure_table(positions)
        pending.extend(streamer.children())
