"""The decoder's pointwise work as Triton kernels: Snakes, bias adds, left context, residual adds.

Compiled by Inductor with dynamic shapes (one compile for every shape), these passes index (B, C, T)
tensors through int64 divisions by runtime sizes; at 64 rows the one that also concatenates a conv's
left context ran at a seventh of the memory bandwidth (docs/PERFORMANCE.md). Here a program covers one (batch row,
channel) and a block of time steps: the channel's alpha and bias are two scalar loads, and time is
contiguous. Computed in fp32, stored in the input's dtype. Importing this module needs Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .codec import Decoder, ResidualPointwise

BLOCK = 1024  # time steps per program


@triton.jit
def _pointwise(source_ptr, context_ptr, bias_ptr, alpha_ptr, residual_ptr, out_ptr,
               channels, length, context_length, eps,
               has_bias: tl.constexpr, snake: tl.constexpr, residual: tl.constexpr, block: tl.constexpr):
    """out[r, :P] = context[r]; out[r, P + t] = f(source[r, t]) with f: + bias, Snake, + residual[r, t]
    as the flags say (P = context_length, 0 without context; r = batch row * channels + channel)."""
    row = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * block + tl.arange(0, block)  # output time step
    out_length = context_length + length
    in_context = t < context_length
    from_source = (t >= context_length) & (t < out_length)
    value = tl.load(source_ptr + row * length + (t - context_length), mask=from_source, other=0.0).to(tl.float32)
    channel = row % channels
    if has_bias:
        value += tl.load(bias_ptr + channel).to(tl.float32)
    if snake:
        alpha = tl.load(alpha_ptr + channel).to(tl.float32)
        wave = tl.sin(alpha * value)
        value += (1.0 / (alpha + eps)) * wave * wave
    if residual:
        value += tl.load(residual_ptr + row * length + (t - context_length), mask=from_source, other=0.0).to(tl.float32)
    context = tl.load(context_ptr + row * context_length + t, mask=in_context, other=0.0).to(tl.float32)
    value = tl.where(in_context, context, value)
    tl.store(out_ptr + row * out_length + t, value.to(out_ptr.dtype.element_ty), mask=t < out_length)


def _launch(source: Tensor, *, context: Tensor | None = None, bias: Tensor | None = None,
            alpha: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None) -> Tensor:
    batch, channels, length = source.shape
    source = source.contiguous()  # and alpha, bias: one value per channel, read at channel offsets
    alpha = None if alpha is None else alpha.reshape(channels).contiguous()
    bias = None if bias is None else bias.reshape(channels).contiguous()
    context_length = 0 if context is None else context.shape[-1]
    out = torch.empty(batch, channels, context_length + length, device=source.device, dtype=source.dtype)
    if context is not None:
        context = context.to(source.dtype).contiguous()
    if residual is not None:
        torch._check(residual.shape == source.shape, lambda: "residual and source shapes differ")
        residual = residual.contiguous()
    grid = (batch * channels, triton.cdiv(context_length + length, BLOCK))
    _pointwise[grid](source, context if context is not None else source, bias if bias is not None else source,
                     alpha if alpha is not None else source, residual if residual is not None else source, out,
                     channels, length, context_length, eps, has_bias=bias is not None, snake=alpha is not None,
                     residual=residual is not None, block=BLOCK)
    return out


def snake(x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    return _launch(x, alpha=alpha, eps=eps)


def context_snake(context: Tensor, x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    return _launch(x, context=context, alpha=alpha, eps=eps)


def biased_snake(x: Tensor, bias: Tensor, alpha: Tensor, eps: float) -> Tensor:
    return _launch(x, bias=bias, alpha=alpha, eps=eps)


def biased_residual(x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
    return _launch(y, bias=bias, residual=x)


def use_in(decoder: Decoder) -> None:
    """Run the decoder's Snakes and its streamed residual units' pointwise work with these kernels."""
    decoder.use_pointwise(snake, ResidualPointwise(context_snake, biased_snake, biased_residual))
