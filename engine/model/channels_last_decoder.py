"""The codec's decoder streamed on channels-last (B, T, C) activations, two kernels per residual unit.

Each layer is one convolution (engine/model/conv_kernel.py) whose input is its carried left context
followed by the chunk, with the Snake before it applied on the way (one context-Snake pass):
  conv in                 context 6 steps (k7), no Snake
  DecoderBlock            Snake, then the transposed conv (stride s, kernel 2s) as a 2-tap conv on
                          the previous input step and this one, s * C_out outputs per step viewed as
                          s steps of C_out (conv_kernel.transposed_as_taps); context 1 step
  ResidualUnit            Snake, dilated k7 conv with the second Snake in its epilogue (context
                          6 * dilation steps), 1x1 conv with the residual add in its epilogue
  Snake, conv out, tanh   context 6 steps, tanh in the epilogue
Every context is stored after its Snake, as codec_stream's streamers keep theirs, and a reset zeroes
it: the whole decode's causal zero padding. The convolutions' weights are copied once, as the kernel
reads them (~0.1 GB in bf16 for S1-mini); biases and Snake alphas are the codec's own. Do not change
the codec's weights after building a decoder on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .codec import Decoder, DecoderBlock
from .codec_convs import CausalConv1d, CausalConvTranspose1d, ResidualUnit, Snake1d
from .stream_state import conv_weight, new_state, read_rows, write_rows, zero_rows
from .conv_kernel import ChannelsLastOps, Epilogue, taps_of, transposed_as_taps


@dataclass
class _Layer:
    """One convolution and the context it carries."""

    taps: Tensor  # (k * C_in, C_out)
    bias: Tensor  # (C_out,)
    dilation: int
    context: Tensor  # (B, (k - 1) * dilation, C_in), after the Snake before the conv, if any
    alpha: Tensor | None  # (C_in,) that Snake's alpha
    eps: float = 0.0


class ChannelsLastDecoder:
    """A codec_stream streamer for the Decoder: step(x (b, latent_dim, n), rows) -> (b, 1, n * hop)."""

    def __init__(self, decoder: Decoder, batch: int, ops: ChannelsLastOps):
        self.ops = ops
        parts = list(decoder.model)
        conv_in, blocks, (last_snake, conv_out, tanh) = parts[0], parts[1:-3], parts[-3:]
        self._decoder, self._batch = decoder, batch
        self._dtype = next(decoder.parameters()).dtype
        self.conv_in = self._conv_layer(conv_in, None)
        self.blocks = []  # (transposed layer, stride, [(dilated layer, second Snake, 1x1 layer)])
        for block in blocks:
            if not isinstance(block, DecoderBlock):
                raise TypeError(f"no channels-last streaming for {type(block).__name__} in the decoder")
            snake, transposed, *units = block.block
            self.blocks.append((self._transposed_layer(transposed, snake), transposed.stride,
                                [self._unit(unit) for unit in units]))
        if not isinstance(last_snake, Snake1d) or not isinstance(tanh, nn.Tanh):
            raise TypeError("the decoder is expected to end with Snake, conv, tanh")
        self.conv_out = self._conv_layer(conv_out, last_snake)

    # --- construction ---------------------------------------------------------------------------

    def _conv_layer(self, m: CausalConv1d, snake: Snake1d | None) -> _Layer:
        if (not isinstance(m, CausalConv1d) or m.stride != 1
                or isinstance(m.conv, nn.Conv1d) and (m.conv.padding != (0,) or m.conv.groups != 1)):
            raise TypeError(f"a stride-1, unpadded, ungrouped causal conv is expected, got {m}")
        weight, dilation = conv_weight(m.conv), _dilation(m.conv)
        return self._layer(taps_of(weight), m.conv.bias, dilation, (weight.shape[-1] - 1) * dilation,
                           weight.shape[1], snake)

    def _transposed_layer(self, m: CausalConvTranspose1d, snake: Snake1d) -> _Layer:
        conv = m.conv
        if isinstance(conv, nn.ConvTranspose1d) and (conv.padding, conv.output_padding, conv.dilation, conv.groups) \
                != ((0,), (0,), (1,), 1):
            raise TypeError(f"a plain transposed conv is expected, got {conv}")
        weight = conv_weight(conv)
        return self._layer(transposed_as_taps(weight), conv.bias.repeat(m.stride), 1, 1, weight.shape[0], snake)

    def _unit(self, unit: ResidualUnit) -> tuple[_Layer, Snake1d, _Layer]:
        first_snake, dilated, second_snake, pointwise = unit.block
        return self._conv_layer(dilated, first_snake), second_snake, self._conv_layer(pointwise, None)

    def _layer(self, taps, bias, dilation, context_steps, c_in, snake: Snake1d | None) -> _Layer:
        if snake is not None and not context_steps:
            raise TypeError("a Snake before a convolution without context is not streamed here")
        taps, bias = taps.to(self._dtype).contiguous(), bias.detach().to(self._dtype).contiguous()
        alpha = None if snake is None else snake.alpha.detach().reshape(-1).contiguous()
        context = new_state(self._batch, context_steps, c_in, self._decoder)  # laid out (B, steps, C_in)
        return _Layer(taps, bias, dilation, context, alpha,
                      0.0 if snake is None else snake.eps)

    # --- streaming ------------------------------------------------------------------------------

    def step(self, x: Tensor, rows) -> Tensor:
        h = self._apply(self.conv_in, x.transpose(1, 2).to(self._dtype).contiguous(), rows)
        for transposed, stride, units in self.blocks:
            batch, steps, _ = h.shape
            h = self._apply(transposed, h, rows).view(batch, steps * stride, -1)
            for dilated, second_snake, pointwise in units:
                y = self._apply(dilated, h, rows, Epilogue(alpha=second_snake.alpha.reshape(-1), eps=second_snake.eps))
                h = self._apply(pointwise, y, rows, Epilogue(residual=h))
        audio = self._apply(self.conv_out, h, rows, Epilogue(tanh=True))  # (b, T, 1)
        return audio.transpose(1, 2)

    def _apply(self, layer: _Layer, x: Tensor, rows, epilogue: Epilogue = Epilogue()) -> Tensor:
        if layer.context.shape[1]:
            context = read_rows(layer.context, rows)
            if layer.alpha is None:
                full = torch.cat([context, x], 1)
            else:
                full = self.ops.context_snake(context, x, layer.alpha, layer.eps)
            write_rows(layer.context, rows, full[:, full.shape[1] - layer.context.shape[1]:])
        else:
            full = x  # a 1x1 conv (never after a Snake here)
        return self.ops.conv(full, layer.taps, layer.bias, layer.dilation, epilogue)

    def reset(self, rows) -> None:
        for layer in self._layers():
            zero_rows(layer.context, rows)

    def _layers(self) -> list[_Layer]:
        layers = [self.conv_in, self.conv_out]
        for transposed, _, units in self.blocks:
            layers.append(transposed)
            for dilated, _, pointwise in units:
                layers += [dilated, pointwise]
        return layers

    def children(self) -> list:
        return []


def _dilation(conv: nn.Module) -> int:
    return conv.dilation if isinstance(conv.dilation, int) else conv.dilation[0]
