"""The layers the DualAR transformer and the codec's transformers share: RMSNorm and rotary
position embeddings (RoPE) on interleaved pairs."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend

# Attention backends that need no per-shape plan. cuDNN attention builds an execution plan for every
# new (query, key) shape, milliseconds of host time per layer, at every process start; the prefill
# meets a new length with most requests, and the codec's graphs one shape per row count and chunk.
PLAN_FREE_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Normalise in fp32, round to the activation dtype, then scale (the reference's order)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def rope_table(positions: int, head_dim: int, base: float, *, negative_power: bool = False) -> Tensor:
    """(positions, head_dim / 2, [cos, sin]) built in fp32 and rounded to bf16, as the references do.

    The two reference implementations write the frequencies differently, 1 / base**e (DualAR) and
    base**-e (the codec, negative_power=True), which round differently in fp32 and give tables
    that differ in the last bf16 bit at some positions: each model keeps its reference's."""
    exponents = torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim
    freqs = base ** -exponents if negative_power else 1.0 / (base ** exponents)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16)


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x (B, T, H, D) in fp32; table (T, D/2, 2) or, for
    per-row positions, (B, T, D/2, 2), in bf16 or fp32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    table = table.float()
    cos, sin = table[..., None, :, 0], table[..., None, :, 1]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2).type_as(x)
