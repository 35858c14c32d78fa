"""Batched on-device sampling: repetition penalty, top-p, temperature, seeded noise.

Order of operations follows the reference (fish-speech d3df505): repetition penalty, then top-p on
the penalised logits, then temperature, softmax, and an exponential race `argmax(p / q)` with
q ~ Exp(1). Every parameter is a per-row tensor, so one call serves a whole batch and nothing here
needs the host (no `.item()`), which keeps the step graph-capturable.

Differences from the reference, on purpose:
- each codebook is penalised with its own history; the reference penalises codebook 0 with the
  first column of the window across all rows (a bug since its commit 83afe68), and
- the window holds the last `window` frames this request generated, the first one included and
  nothing that was not generated (the reference skips the prefill frame and counts unwritten zeros),
- the noise is counter-based (a hash of request seed, frame and codebook), so a request samples the
  same values alone or in any batch, with no generator state to carry or capture,
- the maths runs in fp32 rather than the logits' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

REPETITION_WINDOW = 16
_MASK32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    """Per-row sampling parameters, each shaped (B, 1) float32, and noise keys (B,) int64."""

    temperature: Tensor
    top_p: Tensor
    repetition_penalty: Tensor
    noise_key: Tensor

    @classmethod
    def build(cls, temperature, top_p, repetition_penalty, noise_key, device) -> "SamplingTensors":
        def col(values):
            return torch.tensor(values, dtype=torch.float32, device=device).reshape(-1, 1)

        return cls(col(temperature), col(top_p), col(repetition_penalty),
                   torch.tensor(noise_key, dtype=torch.int64, device=device).reshape(-1))


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash on int64 tensors; multipliers < 2^31 keep every product below 2^63."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(noise_key: Tensor, counter: Tensor, n: int) -> Tensor:
    """(B, n) uniforms strictly inside (0, 1), a pure function of (key, counter, column).

    23 bits plus a half step: every value is exact in fp32, so u never rounds to 1 (q = -log u
    would be 0 and the exponential race would divide by zero)."""
    base = _mix32((noise_key ^ _mix32(counter & _MASK32)) & _MASK32)
    columns = torch.arange(n, device=noise_key.device, dtype=torch.int64)
    # Two rounds over (base + column): no multiply on the column index, which compiled kernels may
    # compute in 32-bit arithmetic.
    bits = _mix32(_mix32((base[:, None] + columns) & _MASK32))
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))


def noise_counter(frame_index: Tensor, codebook: int) -> Tensor:
    return frame_index * 64 + codebook


def apply_repetition_penalty(logits: Tensor, history: Tensor, valid: Tensor, penalty: Tensor) -> Tensor:
    """Penalise each id seen in the row's valid history once: divide positive logits, multiply negative."""
    seen = torch.zeros_like(logits).scatter_add_(1, history, valid.to(logits.dtype)) > 0
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def apply_top_p(logits: Tensor, top_p: Tensor) -> Tensor:
    """The reference's nucleus: keep each id whose probability plus that of every likelier id is at
    most top_p (so the id that crosses top_p is dropped), and always the likeliest id. Equal logits
    rank by index (a stable sort's order), so the kept set is well defined."""
    if torch.compiler.is_compiling() and logits.shape[0] == 1:
        remove = outside_nucleus_pairwise(logits, top_p)  # the compiled batch-1 step: no sort kernel
    else:  # eager, and compiled batched steps that sampling_kernel does not serve (no Triton, the full vocabulary)
        remove = outside_nucleus_sorted(logits, top_p)
    return logits.masked_fill(remove, float("-inf"))


def outside_nucleus_sorted(logits: Tensor, top_p: Tensor) -> Tensor:
    """(B, V) bool: the ids apply_top_p drops, by sorting each row."""
    sorted_logits, order = torch.sort(logits, descending=True, stable=True, dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative > top_p
    remove_sorted[:, 0].fill_(False)  # on the device (`= False` copies a host scalar, waiting on CUDA)
    return torch.zeros_like(remove_sorted).scatter_(1, order, remove_sorted)


def outside_nucleus_pairwise(logits: Tensor, top_p: Tensor) -> Tensor:
    """The same set without a sort: an id's cumulative probability is its own plus that of every id
    ranked before it. Compiled, the (V, V) comparison is one fused reduction that is never stored;
    for one row it replaces a sort kernel and the scatter after it."""
    probs = logits.softmax(dim=-1)
    ids = torch.arange(logits.shape[-1], device=logits.device)
    other, this = logits[:, None, :], logits[:, :, None]
    ahead = (other > this) | ((other == this) & (ids[None, :] < ids[:, None]))
    cumulative = probs + (probs[:, None, :] * ahead).sum(dim=-1)
    likeliest = logits.argmax(dim=-1, keepdim=True)  # the first of equal maxima, as ranked above
    return (cumulative > top_p) & (ids[None, :] != likeliest)


def sample(logits: Tensor, params: SamplingTensors, history: Tensor, valid: Tensor, counter: Tensor) -> Tensor:
    """logits (B, V) -> sampled ids (B,) int64. history (B, W) ids, valid (B, W) bool, counter (B,)."""
    logits = logits.float()
    logits = apply_repetition_penalty(logits, history, valid, params.repetition_penalty)
    logits = apply_top_p(logits, params.top_p)
    probs = (logits / params.temperature.clamp_min(1e-5)).softmax(dim=-1)
    exp_noise = -torch.log(uniform_noise(params.noise_key, counter, logits.shape[-1]))
    return torch.argmax(probs / exp_noise, dim=-1)
