"""The codec's convolution layers: weight-normed and causal convolutions, Snake, residual units
and ConvNeXt blocks."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec_config import ConvNeXtConfig


def weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """g * v / ||v||, the norm over every dim but 0 (for a transposed conv, dim 0 is the input)."""
    g, v = g.float(), v.float()
    return v * (g / v.norm(dim=tuple(range(1, v.dim())), keepdim=True))


class _GV(nn.Module):
    """g and v under the names torch's weight_norm parametrization saves them with."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.original0 = nn.Parameter(torch.empty(shape[0], 1, 1))  # g
        self.original1 = nn.Parameter(torch.empty(shape))  # v


class WNConv(nn.Module):
    """Conv1d / ConvTranspose1d (no padding) with a weight-normed weight.

    legacy=False keeps g, v as `parametrizations.weight.original0/1` (the codec's convs); legacy=True
    as `weight_g` / `weight_v` (the VQ projections, from the old torch.nn.utils.weight_norm).
    `fused()` returns the equivalent plain conv, so inference does not recompute g v / |v|.
    """

    def __init__(self, c_in, c_out, kernel_size, stride=1, dilation=1, transpose=False, legacy=False):
        super().__init__()
        shape = (c_in, c_out, kernel_size) if transpose else (c_out, c_in, kernel_size)
        self.stride, self.dilation, self.transpose, self.legacy = stride, dilation, transpose, legacy
        self.bias = nn.Parameter(torch.empty(c_out))
        if legacy:
            self.weight_g = nn.Parameter(torch.empty(shape[0], 1, 1))
            self.weight_v = nn.Parameter(torch.empty(shape))
        else:
            self.parametrizations = nn.ModuleDict({"weight": _GV(shape)})

    @property
    def g_v(self) -> tuple[Tensor, Tensor]:
        if self.legacy:
            return self.weight_g, self.weight_v
        gv = self.parametrizations["weight"]
        return gv.original0, gv.original1

    def forward(self, x: Tensor) -> Tensor:
        w = weight_norm(*self.g_v).to(x.dtype)
        if self.transpose:
            return F.conv_transpose1d(x, w, self.bias, self.stride)
        return F.conv1d(x, w, self.bias, self.stride, dilation=self.dilation)

    def fused(self) -> nn.Conv1d | nn.ConvTranspose1d:
        g, v = self.g_v
        cls = nn.ConvTranspose1d if self.transpose else nn.Conv1d
        c_in, c_out = (v.shape[0], v.shape[1]) if self.transpose else (v.shape[1], v.shape[0])
        conv = cls(c_in, c_out, v.shape[2], stride=self.stride, dilation=self.dilation, device="meta")
        conv.weight = nn.Parameter(weight_norm(g, v).to(v.dtype), requires_grad=v.requires_grad)
        conv.bias = self.bias
        return conv


class CausalConv1d(nn.Module):
    """Left-pad k_eff - stride, right-pad to a whole number of strides: output length ceil(n / stride)."""

    def __init__(self, c_in, c_out, kernel_size, stride=1, dilation=1, groups=1, wn=True):
        super().__init__()
        if wn:
            self.conv = WNConv(c_in, c_out, kernel_size, stride, dilation)
        else:
            self.conv = nn.Conv1d(c_in, c_out, kernel_size, stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.left_pad = (kernel_size - 1) * dilation + 1 - stride

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.left_pad, -x.shape[-1] % self.stride)))


class CausalConvTranspose1d(nn.Module):
    """Transposed conv, then trim kernel_size - stride samples on the right: output length n * stride."""

    def __init__(self, c_in, c_out, kernel_size, stride, wn=True):
        super().__init__()
        if wn:
            self.conv = WNConv(c_in, c_out, kernel_size, stride, transpose=True)
        else:
            self.conv = nn.ConvTranspose1d(c_in, c_out, kernel_size, stride)
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)[..., : x.shape[-1] * self.stride]


@contextlib.contextmanager
def matmuls_round_like_convs():
    """fp32 CUDA matmuls standing in for convolutions round as cuDNN's convolutions do: in TF32
    exactly when those are (torch's default; the reference runs its 1x1 convolutions through cuDNN).
    The flag is the process's: set only on the thread that runs the codec (the engine's GPU worker)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def snake(x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """x + sin(alpha x)^2 / alpha, per channel. Eagerly five passes over x; compiled, one kernel."""
    return x + (alpha + eps).reciprocal() * torch.sin(alpha * x).pow(2)


class Snake1d(nn.Module):
    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(1, channels, 1))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return snake(x, self.alpha, self.eps)


def context_snake(context: Tensor, x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """cat(context, snake(x)) in time: the input of a streamed causal conv after a Snake."""
    return torch.cat([context.to(x.dtype), snake(x, alpha, eps)], -1)


def biased_snake(x: Tensor, bias: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """snake(x + bias): a conv's bias added after the conv, with the Snake that follows it."""
    return snake(x + bias[:, None], alpha, eps)


def biased_residual(x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
    """x + (y + bias): a residual unit's output from its last conv without that conv's bias."""
    return x + (y + bias[:, None])


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, snake_eps: float):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim, snake_eps),
            CausalConv1d(dim, dim, 7, dilation=dilation),
            Snake1d(dim, snake_eps),
            CausalConv1d(dim, dim, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv, LayerNorm, pointwise MLP (GELU), layer scale, residual."""

    def __init__(self, cfg: ConvNeXtConfig):
        super().__init__()
        dim = cfg.dim
        self.gamma = nn.Parameter(torch.empty(dim))
        self.dwconv = CausalConv1d(dim, dim, cfg.kernel_size, groups=dim, wn=False)
        self.norm = nn.LayerNorm(dim, eps=cfg.layernorm_eps)
        self.pwconv1 = nn.Linear(dim, cfg.mlp_ratio * dim)
        self.pwconv2 = nn.Linear(cfg.mlp_ratio * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.dwconv(x).transpose(1, 2))
        y = self.pwconv2(F.gelu(self.pwconv1(y)))
        return x + (self.gamma * y).transpose(1, 2)
