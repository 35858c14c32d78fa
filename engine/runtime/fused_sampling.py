"""A fast codebook's whole sampling step in one Triton kernel, for the compiled batch-1 step.

`generate.sample_and_embed` compiled by Inductor was five kernels per codebook at batch 1 (the
penalty's scatter, softmax statistics, the pairwise top-p reduction, the noise race, the embedding
gather: ~9.5 us on an H100, most of it the fixed cost of each dependent launch). Here one launch
does `sampling.sample` and the embedding for each row:

- program (row, slice) recomputes the row's penalised logits and softmax statistics (a few KB from
  L2), then ranks each id of its slice against every id: an id's cumulative probability is its own
  plus that of every id ranked before it (higher logit, or equal logit and lower index), as in
  `sampling.outside_nucleus_pairwise`. The kept ids are those ranked at or above a threshold, so
  each program contributes the lowest rank it keeps (atomic min);
- the row's last program to finish (an atomic ticket) applies the threshold, the temperature, the
  counter-based noise of `sampling.uniform_noise` and the exponential race, writes the code and its
  embedding, and resets the row's two counters for the next launch. Programs exchange nothing but
  those atomics.

Same operations as the plain path in fp32; sums may round in another order. Launched with
programmatic dependent launch where available (like model/fused_linear.py). The step calls it
between its compiled regions (runtime/step_runner.py), so it is not an op Inductor sees. Importing
this module needs Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..compilation import pdl_available
from ..model.launch_control import wait_for_inputs

SLICE = 32  # ids each program ranks
CHUNK = 64  # ids each program compares its slice with per iteration
NUM_WARPS = 4
NO_THRESHOLD = 2 ** 63 - 1  # the row counters' resting state: (threshold, tickets) = (NO_THRESHOLD, 0)
_NO_THRESHOLD = tl.constexpr(NO_THRESHOLD)


@triton.jit
def _mix32(x):
    """sampling._mix32 on int64 values below 2^32."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _penalised(logits_row, ids, live, history, penalty):
    """The logits of `ids` in fp32 after the repetition penalty (-inf where not live), with -0.0 as
    +0.0 so that equal logits compare equal in the rank below, as they do in torch. history: the
    row's valid history ids, -1 for invalid entries."""
    x = tl.load(logits_row + ids, mask=live, other=float("-inf")).to(tl.float32)
    seen = tl.max((ids[:, None] == history[None, :]).to(tl.int32), 1) != 0
    x = tl.where(seen & live, tl.where(x < 0, x * penalty, x / penalty), x)
    return tl.where(x == 0, 0.0, x)


@triton.jit
def _rank(x, ids, block: tl.constexpr):
    """An int64 that orders ids as the nucleus ranks them: higher logit first, then lower index."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # float order as signed-int order
    return (ordered.to(tl.int64) << 32) | (block - 1 - ids).to(tl.int64)


@triton.jit
def _sample_codebook(logits_ptr, temperature_ptr, top_p_ptr, penalty_ptr, noise_key_ptr, counter_ptr,
                     history_ptr, valid_ptr, embeddings_ptr, codes_ptr, embedded_ptr, counters_ptr,
                     V: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr, DIM: tl.constexpr,
                     SLICE: tl.constexpr, CHUNK: tl.constexpr, pdl: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if pdl:  # everything below may have been written by the kernels before
        after = wait_for_inputs()
        logits_ptr += after
        history_ptr += after
        counter_ptr += after
    logits_row = logits_ptr + b * V
    window = tl.arange(0, WINDOW)
    history = tl.where(tl.load(valid_ptr + b * WINDOW + window) != 0, tl.load(history_ptr + b * WINDOW + window), -1)
    penalty = tl.load(penalty_ptr + b)
    ids = tl.arange(0, BLOCK)
    live = ids < V
    x = _penalised(logits_row, ids, live, history, penalty)
    top = tl.max(x, 0)
    total = tl.sum(tl.exp(x - top), 0)
    likeliest = tl.max(_rank(x, ids, BLOCK), 0)

    # This program's ids: cumulative probability = own + every id ranked before.
    mine = tl.program_id(1) * SLICE + tl.arange(0, SLICE)
    mine_live = mine < V
    x_mine = _penalised(logits_row, mine, mine_live, history, penalty)
    rank_mine = _rank(x_mine, mine, BLOCK)
    cumulative = tl.exp(x_mine - top) / total
    for first in tl.static_range(0, BLOCK, CHUNK):
        other = first + tl.arange(0, CHUNK)
        x_other = _penalised(logits_row, other, other < V, history, penalty)
        ahead = _rank(x_other, other, BLOCK)[None, :] > rank_mine[:, None]
        cumulative += tl.sum(tl.where(ahead, (tl.exp(x_other - top) / total)[None, :], 0.0), 1)
    keep = ((cumulative <= tl.load(top_p_ptr + b)) | (rank_mine == likeliest)) & mine_live
    tl.atomic_min(counters_ptr + 2 * b, tl.min(tl.where(keep, rank_mine, _NO_THRESHOLD), 0), sem="acq_rel")
    ticket = tl.atomic_add(counters_ptr + 2 * b + 1, 1, sem="acq_rel")
    if ticket == tl.num_programs(1) - 1:  # the row's last program: every slice has voted
        threshold = tl.atomic_xchg(counters_ptr + 2 * b, _NO_THRESHOLD, sem="acq_rel")
        tl.atomic_xchg(counters_ptr + 2 * b + 1, 0, sem="acq_rel")
        kept = tl.where(_rank(x, ids, BLOCK) >= threshold, x, float("-inf"))
        scaled = kept / tl.maximum(tl.load(temperature_ptr + b), 1e-5)
        weights = tl.exp(scaled - tl.max(scaled, 0))
        probs = weights / tl.sum(weights, 0)
        # sampling.uniform_noise for (key, counter), column by column, and the exponential race
        counter = tl.load(counter_ptr + b)
        base = _mix32((tl.load(noise_key_ptr + b) ^ _mix32(counter & 0xFFFFFFFF)) & 0xFFFFFFFF)
        bits = _mix32(_mix32((base + ids) & 0xFFFFFFFF))
        uniform = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608)
        race = tl.where(live, probs / -tl.log(uniform), -1.0)
        code = tl.argmax(race, 0)
        tl.store(codes_ptr + b, code.to(tl.int64))
        d = tl.arange(0, DIM)
        tl.store(embedded_ptr + b * DIM + d, tl.load(embeddings_ptr + code.to(tl.int64) * DIM + d))


_counters: dict[tuple[torch.device, int], Tensor] = {}


def _row_counters(device: torch.device, rows: int) -> Tensor:
    """(rows, 2) int64 (threshold, tickets) at rest, kept per device and batch size: each launch
    leaves them as it found them, so a CUDA graph replays the kernel with no reset of its own."""
    counters = _counters.get((device, rows))
    if counters is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fused_sampling.sample_codebook first ran inside a CUDA graph capture; "
                               "run it once before capturing (compiled steps warm up first)")
        counters = torch.tensor([[NO_THRESHOLD, 0]] * rows, dtype=torch.int64, device=device)
        _counters[(device, rows)] = counters
    return counters


def sample_codebook(logits: Tensor, temperature: Tensor, top_p: Tensor, repetition_penalty: Tensor,
                    noise_key: Tensor, counter: Tensor, history: Tensor, valid: Tensor,
                    embeddings: Tensor) -> tuple[Tensor, Tensor]:
    """generate.sample_and_embed in one kernel: logits (B, V); temperature, top_p, repetition_penalty
    (B, 1) fp32; noise_key, counter (B,) int64; history (B, W) ids and valid (B, W) bool; embeddings
    (n, dim), dim a power of two. Returns the sampled codes (B,) int64 and their embeddings
    (B, 1, dim). On CUDA (or Triton's interpreter)."""
    rows, vocab = logits.shape
    dim = embeddings.shape[1]
    torch._check(dim & (dim - 1) == 0, lambda: "embedding width must be a power of two")
    logits, history, valid = logits.contiguous(), history.contiguous(), valid.contiguous()
    codes = torch.empty(rows, dtype=torch.int64, device=logits.device)
    embedded = torch.empty((rows, 1, dim), dtype=embeddings.dtype, device=logits.device)
    block = triton.next_power_of_2(vocab)
    pdl = pdl_available(logits.device)
    launch_options = {"launch_pdl": True} if pdl else {}
    _sample_codebook[(rows, triton.cdiv(vocab, SLICE))](
        logits, temperature.contiguous(), top_p.contiguous(), repetition_penalty.contiguous(), noise_key.contiguous(),
        counter.contiguous(), history, valid, embeddings.contiguous(), codes, embedded,
        _row_counters(logits.device, rows), V=vocab, BLOCK=block, WINDOW=history.shape[1], DIM=dim,
        SLICE=SLICE, CHUNK=min(CHUNK, block), pdl=pdl, num_warps=NUM_WARPS, **launch_options)
    return codes, embedded
