"""A channels-last 1-D convolution as one Triton kernel, with the codec decoder's pointwise work in
its epilogue.

cuDNN runs the decoder's convolutions on (B, C, T) activations fastest, but only after converting
them to NHWC and back around each call, and the Snakes, bias and residual adds around each conv are
passes of their own (together more than half of a codec call's GPU time). Here
the activations stay (B, T, C): a tap of a dilated convolution is then a block of whole rows shifted
in time, so every operand tile is an aligned, contiguous load, and the convolution is a matmul whose
K loop runs over (tap, input channel block). The epilogue adds the bias and, as asked, a Snake, a
residual or a tanh, so a residual unit is two kernels and a transposed convolution (stride s, kernel
2s) is this kernel with two taps and s * C_out output channels (`transposed_as_taps`).

`conv_taps` is the same computation in PyTorch: the CPU's path and the kernel's reference in tests.
Importing this module needs Triton only for `conv`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .codec_convs import snake
from .compile_ahead import launch


@dataclass(frozen=True)
class Epilogue:
    """What the kernel applies to (conv + bias), in this order: Snake with `alpha`, + `residual`, tanh."""

    alpha: Tensor | None = None  # (C_out,) Snake's alpha
    eps: float = 0.0
    residual: Tensor | None = None  # (B, T, C_out)
    tanh: bool = False


@dataclass(frozen=True)
class ChannelsLastOps:
    """What the channels-last decoder is made of: these Triton kernels, or their PyTorch forms."""

    conv: Callable  # (x, taps, bias, dilation, epilogue) -> (B, T, C_out)
    context_snake: Callable  # (context, x, alpha, eps) -> cat(context, snake(x)) in time


def taps_of(weight: Tensor) -> Tensor:
    """A Conv1d weight (C_out, C_in, k) as the kernel reads it: (k * C_in, C_out), tap-major."""
    c_out, c_in, k = weight.shape
    return weight.permute(2, 1, 0).reshape(k * c_in, c_out).contiguous()


def transposed_as_taps(weight: Tensor) -> Tensor:
    """A ConvTranspose1d weight (C_in, C_out, 2s), stride s, as the taps of a 2-tap convolution
    (2 * C_in, s * C_out) whose output row t, viewed as s rows of C_out, is the transposed
    convolution's output rows t*s .. t*s + s - 1: output t*s + j takes input t through tap j and
    input t - 1 through tap j + s. Channel j * C_out + c of the output is (j, c)."""
    c_in, c_out, k = weight.shape
    s = k // 2
    if k != 2 * s:
        raise ValueError(f"a transposed conv of kernel 2 * stride is expected, got kernel {k}")
    first, second = weight[..., s:], weight[..., :s]  # applied to inputs t - 1 and t
    as_taps = torch.stack([first, second])  # (2, C_in, C_out, s)
    return as_taps.permute(0, 1, 3, 2).reshape(2 * c_in, s * c_out).contiguous()


def conv_taps(x: Tensor, taps: Tensor, bias: Tensor, dilation: int, epilogue: Epilogue = Epilogue()) -> Tensor:
    """x (B, T + (k - 1) * dilation, C_in), its left context first -> (B, T, C_out): the valid
    convolution with `taps` (k * C_in, C_out), + bias, then the epilogue. In PyTorch, fp32 sums."""
    c_out = taps.shape[1]
    k = taps.shape[0] // x.shape[-1]
    weight = taps.reshape(k, x.shape[-1], c_out).permute(2, 1, 0).float()
    y = F.conv1d(x.float().transpose(1, 2), weight, bias.float(), dilation=dilation).transpose(1, 2)
    return _finish(y, epilogue).to(x.dtype).contiguous()


def context_snake_taps(context: Tensor, x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """cat(context, snake(x)) in time, both (B, ., C): a streamed conv's input after a Snake. PyTorch."""
    y = snake(x.float(), alpha.float().reshape(-1), eps)
    return torch.cat([context.to(x.dtype), y.to(x.dtype)], 1)


def _finish(y: Tensor, epilogue: Epilogue) -> Tensor:
    if epilogue.alpha is not None:
        y = snake(y, epilogue.alpha.float().reshape(-1), epilogue.eps)
    if epilogue.residual is not None:
        y = y + epilogue.residual.float()
    return torch.tanh(y) if epilogue.tanh else y


try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU's path needs none of what follows
    triton = None

if triton is not None:

    @triton.jit
    def _snake(x, alpha, eps, fast_sin: tl.constexpr):
        """x + sin(alpha x)^2 / (alpha + eps), in fp32. fast_sin: NVIDIA's sin.approx (absolute error
        ~1e-6 for |alpha x| < 100, far below the bf16 rounding of the result); libdevice's sinf, which
        the interpreter runs, makes a conv with this epilogue about three times slower."""
        if fast_sin:
            wave = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [alpha * x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            wave = tl.sin(alpha * x)
        return x + (1.0 / (alpha + eps)) * wave * wave

    @triton.jit(do_not_specialize=["dilation", "k_blocks"])  # fewer compiles: neither aligns anything
    def _conv_kernel(x_ptr, taps_ptr, bias_ptr, alpha_ptr, residual_ptr, out_ptr,
                     length, x_row_stride, c_in, c_out, dilation, k_blocks, eps,
                     snake: tl.constexpr, residual: tl.constexpr, tanh: tl.constexpr, fast_sin: tl.constexpr,
                     even_k: tl.constexpr, wide: tl.constexpr, precision: tl.constexpr,
                     block_m: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr):
        """out[b, t, n] = sum over tap, c of x[b, t + tap * dilation, c] * taps[tap * c_in + c, n], then
        the epilogue. Program (m, b, n): rows t of block m of batch row b, channels of block n.
        even_k: c_in is a multiple of block_k (no channel masks). wide: a batch row's elements do not
        fit int32 offsets (otherwise only the row's base is 64-bit: a tile of 64-bit offsets cost the
        epilogue's stores more registers and time). precision: of fp32 dots ("tf32" where cuDNN would
        use TF32, else "ieee")."""
        row = tl.program_id(1).to(tl.int64)
        t = tl.program_id(0) * block_m + tl.arange(0, block_m)
        if wide:
            t = t.to(tl.int64)
        n = tl.program_id(2) * block_n + tl.arange(0, block_n)
        c = tl.arange(0, block_k)
        in_rows, in_channels = t < length, n < c_out
        x_rows = x_ptr + row * x_row_stride + (t[:, None] * c_in + c[None, :])
        w_cols = taps_ptr + c[:, None] * c_out + n[None, :]
        blocks_per_tap = tl.cdiv(c_in, block_k)
        acc = tl.zeros((block_m, block_n), dtype=tl.float32)
        for i in range(k_blocks):  # (tap, channel block) flattened, so that the loads pipeline
            tap = i // blocks_per_tap
            if wide:
                tap = tap.to(tl.int64)
            channel = (i - tap * blocks_per_tap) * block_k  # first input channel of the block
            a_mask, w_mask = in_rows[:, None], in_channels[None, :]
            if not even_k:
                a_mask = a_mask & (channel + c < c_in)[None, :]
                w_mask = w_mask & (channel + c < c_in)[:, None]
            a = tl.load(x_rows + (tap * dilation * c_in + channel), mask=a_mask, other=0.0)
            w = tl.load(w_cols + (tap * c_in + channel) * c_out, mask=w_mask, other=0.0)
            acc = tl.dot(a, w, acc, input_precision=precision)
        acc += tl.load(bias_ptr + n, mask=in_channels, other=0.0).to(tl.float32)[None, :]
        if snake:
            alpha = tl.load(alpha_ptr + n, mask=in_channels, other=1.0).to(tl.float32)[None, :]
            acc = _snake(acc, alpha, eps, fast_sin)
        row_start = row * length * c_out
        offsets = t[:, None] * c_out + n[None, :]
        mask = in_rows[:, None] & in_channels[None, :]
        if residual:
            acc += tl.load(residual_ptr + row_start + offsets, mask=mask, other=0.0).to(tl.float32)
        if tanh:
            acc = 2.0 / (1.0 + tl.exp(-2.0 * acc)) - 1.0
        tl.store(out_ptr + row_start + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _context_snake_kernel(context_ptr, x_ptr, alpha_ptr, out_ptr, context_length, length, channels, eps,
                              fast_sin: tl.constexpr, block_t: tl.constexpr, block_c: tl.constexpr):
        """out[b] = cat(context[b], snake(x[b])) in time, all (., T, C); program (time block, b)."""
        row = tl.program_id(1).to(tl.int64)
        t = tl.program_id(0) * block_t + tl.arange(0, block_t)[:, None]  # output time step
        c = tl.arange(0, block_c)[None, :]
        in_channels = c < channels
        in_context = (t < context_length) & in_channels
        from_x = (t >= context_length) & (t < context_length + length) & in_channels
        value = tl.load(x_ptr + (row * length + t - context_length) * channels + c, mask=from_x, other=0.0)
        value = value.to(tl.float32)
        alpha = tl.load(alpha_ptr + c, mask=in_channels, other=1.0).to(tl.float32)
        value = _snake(value, alpha, eps, fast_sin)
        context = tl.load(context_ptr + (row * context_length + t) * channels + c, mask=in_context, other=0.0)
        value = tl.where(in_context, context.to(tl.float32), value)
        tl.store(out_ptr + (row * (context_length + length) + t) * channels + c,
                 value.to(out_ptr.dtype.element_ty), mask=in_context | from_x)


@dataclass(frozen=True)
class Tiles:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warps: int = 4
    stages: int = 3


def large_tiles(c_in: int, c_out: int, element_size: int = 2) -> Tiles:
    """The fastest tiles of a sweep over tile shapes at 64 rows x 32 frames in bf16. fp32 operands
    take twice the shared memory per stage: their K blocks are at most 32 (a 128 x 256 tile with K 64
    would need ~288 KB over 3 stages, more than the 227 KB a Hopper SM has)."""
    block_k = 64 if c_in % 64 == 0 else 32 if c_in % 32 == 0 else 16  # 16: masked channels if not a multiple
    if element_size > 2:
        block_k = min(block_k, 32)
    if c_out > 128:
        return Tiles(128, 256, block_k, warps=8, stages=3)
    return Tiles(128, max(32, triton.next_power_of_2(c_out)), block_k, warps=4, stages=4 if block_k == 32 else 3)


MIN_PROGRAMS = 264  # two per SM on the largest GPUs (132 SMs), so that none idles


def tiles_for(c_in: int, c_out: int, rows: int, length: int, element_size: int = 2) -> Tiles:
    """large_tiles(), or smaller ones where those would leave SMs idle: a call of a few rows and
    frames has few positions, and each program then streams a large share of the weights alone.
    The grid has a program per (block of a row's `length` outputs, row, block of channels)."""
    tiles = large_tiles(c_in, c_out, element_size)
    for block_m, block_n in ((tiles.block_m, tiles.block_n), (64, 128), (64, 64), (64, 32)):
        if block_n > tiles.block_n:
            continue
        if rows * triton.cdiv(length, block_m) * triton.cdiv(c_out, block_n) >= MIN_PROGRAMS:
            break
    if (block_m, block_n) == (tiles.block_m, tiles.block_n):
        return tiles
    return Tiles(block_m, block_n, tiles.block_k, warps=4, stages=4 if tiles.block_k == 32 else 3)


def _has_ptx(x: Tensor) -> bool:
    """Whether x's kernels compile to NVIDIA's PTX, which has sin.approx (ROCm's do not)."""
    return x.is_cuda and torch.version.hip is None


def conv(x: Tensor, taps: Tensor, bias: Tensor, dilation: int, epilogue: Epilogue = Epilogue(),
         tiles: Tiles | None = None) -> Tensor:
    """conv_taps() as one Triton kernel: x (B, T + (k - 1) * dilation, C_in) contiguous in its last
    two dims, taps (k * C_in, C_out) and bias (C_out,) contiguous."""
    batch, full_length, c_in = x.shape
    c_out = taps.shape[1]
    k = taps.shape[0] // c_in
    length = full_length - (k - 1) * dilation
    if taps.numel() >= 2**31:
        raise ValueError(f"taps of {taps.numel()} elements: the kernel addresses them with 32-bit offsets")
    if taps.shape[0] != k * c_in or length < 1 or taps.dtype != x.dtype:
        raise ValueError(f"taps {tuple(taps.shape)} {taps.dtype} do not fit x {tuple(x.shape)} {x.dtype} "
                         f"with dilation {dilation}: (k * C_in, C_out) in x's dtype, and x longer than the taps reach")
    if x.stride(2) != 1 or (full_length > 1 and x.stride(1) != c_in):
        raise ValueError(f"x must be (B, T, C_in) with rows contiguous, got strides {x.stride()}")
    tiles = tiles or tiles_for(c_in, c_out, batch, length, x.element_size())
    alpha = None if epilogue.alpha is None else epilogue.alpha.reshape(c_out).contiguous()
    out = torch.empty(batch, length, c_out, device=x.device, dtype=x.dtype)
    residual = epilogue.residual
    if residual is not None and (residual.shape != out.shape or not residual.is_contiguous()):
        raise ValueError(f"the residual must be contiguous {tuple(out.shape)}, got {tuple(residual.shape)}")
    grid = (triton.cdiv(length, tiles.block_m), batch, triton.cdiv(c_out, tiles.block_n))
    launch(_conv_kernel, grid, x, taps, bias, alpha if alpha is not None else bias,
           residual if residual is not None else out, out,
           length, x.stride(0), c_in, c_out, dilation, k * triton.cdiv(c_in, tiles.block_k), epilogue.eps,
           snake=alpha is not None, residual=residual is not None, tanh=epilogue.tanh,
           fast_sin=_has_ptx(x), even_k=c_in % tiles.block_k == 0,
           wide=max(full_length * c_in, length * c_out) + tiles.block_m * max(c_in, c_out) >= 2**31,
           precision="tf32" if torch.backends.cudnn.allow_tf32 else "ieee",
           block_m=tiles.block_m, block_n=tiles.block_n, block_k=tiles.block_k,
           num_warps=tiles.warps, num_stages=tiles.stages)
    return out


def context_snake(context: Tensor, x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """context_snake_taps() as one Triton kernel; context (B, P, C) and x (B, T, C) contiguous."""
    batch, length, channels = x.shape
    context_length = context.shape[1]
    out = torch.empty(batch, context_length + length, channels, device=x.device, dtype=x.dtype)
    block_c = triton.next_power_of_2(channels)
    block_t = max(1, 4096 // block_c)
    grid = (triton.cdiv(context_length + length, block_t), batch)
    launch(_context_snake_kernel, grid, context.contiguous(), x.contiguous(), alpha.reshape(channels).contiguous(), out,
           context_length, length, channels, eps, fast_sin=_has_ptx(x), block_t=block_t, block_c=block_c)
    return out


TORCH_OPS = ChannelsLastOps(conv_taps, context_snake_taps)
TRITON_OPS = ChannelsLastOps(conv, context_snake) if triton is not None else None
