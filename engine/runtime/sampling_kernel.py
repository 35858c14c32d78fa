"""`sampling.sample` for every row of a batch in one Triton kernel, one program per row.

Compiled by Inductor, the batched step samples each codebook in several kernels (the repetition
penalty's scatters, a radix sort of every row for the nucleus, a softmax, the noise race, the
embedding gather). Here one program per row reads its logits once and does all of it in registers:

- the penalty: which ids the valid history holds (W compares per id), then `sampling`'s rule;
- the nucleus without sorting: the boundary is the largest logit T whose ids, with every likelier
  one, hold more than top_p of the mass. A binary search over the logits' order-preserving 32-bit
  keys finds it, one bit a pass, from the mass of the ids above each candidate. Ids above T are
  kept; ids equal to T (equal logits, equal probabilities) are ranked by index as a stable sort
  ranks them, and the j-th is kept while mass(above T) + j * p(T) <= top_p; the likeliest id always;
- temperature, softmax and the exponential race against the same counter-based noise as
  `sampling.uniform_noise` (the same hash, bit for bit);
- the chosen index's token and code, and the code's embedding row, the next fast position's input.

64 rows then take ~14.5 us a fast codebook and ~49 us for codebook 0. One row takes as long, since
the search's 32 passes each end in a reduction across the program: more than Inductor's kernels for
one row (9 us a fast codebook, whose nucleus spreads over many programs), so the batch-1 step keeps
those (frame_sampler._sampled_by_kernel).

Division is correctly rounded and exp and log are libdevice's, as in PyTorch's CUDA kernels, so
probabilities equal the plain path's up to the order of the sums: the kept set and the winner
can differ only where a cumulative probability lies within rounding of top_p (so at top_p = 1 the
plain path's sums, which can pass 1, may drop a few of the least likely ids that this keeps) or two
noisy scores tie (tests/test_sampling_kernel.py compares the two). Importing this module needs Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from ..compilation import pdl_available
from ..model.launch_control import launch_options, wait_for_inputs

MAX_IDS = 8192  # one row's logits live in one program's registers


@triton.jit
def _mix32(x):
    """sampling._mix32 on uint32 values (its products, masked to 32 bits, are these wrapping ones)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x5BD1E995
    return x ^ (x >> 16)


@triton.jit
def _uniform_noise(key, counter, cols):
    """sampling.uniform_noise for one row: key and counter int64 scalars, cols uint32."""
    base = _mix32(key.to(tl.uint32) ^ _mix32(counter.to(tl.uint32)))
    bits = _mix32(_mix32(base + cols))
    return ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / (1 << 23))


@triton.jit
def _softmax(x):
    e = libdevice.exp(x - tl.max(x, 0))
    return libdevice.div_rn(e, tl.sum(e, 0))


@triton.jit
def _order_key(x):
    """uint32 keys that order as the fp32 values do (-inf lowest)."""
    bits = x.to(tl.uint32, bitcast=True)
    negative = (bits.to(tl.int32, bitcast=True) >> 31).to(tl.uint32, bitcast=True)  # all ones if x < 0
    return bits ^ (negative | (tl.full([], 1, tl.uint32) << 31))


@triton.jit
def _outside_nucleus(x, probs, top_p, live):
    """The ids apply_top_p drops (see the module docstring): x the penalised logits, probs their softmax."""
    key = _order_key(tl.where(x == 0, 0.0, x))  # -0.0 ties with 0.0, as the sort ranks them
    # The boundary's key, decided from the top bit down. It stays 0, below every value's key, when
    # the whole row holds no more than top_p: then nothing is dropped.
    prefix = tl.full([], 0, tl.uint32)
    above = tl.full([], 0.0, tl.float32)  # the mass of ids whose key is above the boundary's
    for bit in tl.static_range(31, -1, -1):
        with_bit = prefix | tl.full([], 1 << bit, tl.uint32)
        # The ids that share the decided bits and have this one set, and their mass.
        upper = tl.sum(tl.where((key >> bit) == (with_bit >> bit), probs, 0.0), 0)
        set_bit = above + upper > top_p
        prefix = tl.where(set_bit, with_bit, prefix)
        above = tl.where(set_bit, above, above + upper)
    tie = live & (key == prefix)
    tie_prob = tl.max(tl.where(tie, probs, 0.0), 0)
    tie_rank = tl.cumsum(tie.to(tl.int32), 0).to(tl.float32)
    kept = (key > prefix) | (tie & (above + tie_rank * tie_prob <= top_p))
    likeliest = tl.argmax(x, 0, tie_break_left=True)
    ids = tl.arange(0, x.shape[0])
    return live & ~(kept | (ids == likeliest))


@triton.jit
def _sample_rows(logits_ptr, logits_stride, history_ptr, history_stride, valid_ptr, valid_stride,
                 temperature_ptr, top_p_ptr, penalty_ptr, param_stride, key_ptr, counter_ptr, counter_stride,
                 embeddings_ptr, token_ptr, code_ptr, embedded_ptr, n_logits, id_begin, n_ids, extra_id,
                 WINDOW: tl.constexpr, DIM: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                 pdl: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_V)
    live = cols < n_logits
    # Everything but the logits was written before the kernel before (the head): read it first.
    entries = tl.arange(0, WINDOW)
    history = tl.load(history_ptr + row * history_stride + entries)
    valid = tl.load(valid_ptr + row * valid_stride + entries) != 0
    index = tl.where((history >= id_begin) & (history < id_begin + n_ids), history - id_begin,
                     tl.where(history == extra_id, n_ids, -1))
    index = tl.where(valid, index, -1)
    seen = tl.max((index[:, None] == cols[None, :]).to(tl.int32), 0) > 0
    penalty = tl.load(penalty_ptr + row * param_stride)
    top_p = tl.load(top_p_ptr + row * param_stride)
    temperature = tl.maximum(tl.load(temperature_ptr + row * param_stride), 1e-5)
    noise = _uniform_noise(tl.load(key_ptr + row), tl.load(counter_ptr + row * counter_stride), cols.to(tl.uint32))
    if pdl:
        logits_ptr += wait_for_inputs()
    x = tl.load(logits_ptr + row * logits_stride + cols, mask=live, other=float("-inf")).to(tl.float32)
    x = tl.where(seen, tl.where(x < 0, x * penalty, libdevice.div_rn(x, penalty)), x)
    drop = _outside_nucleus(x, _softmax(x), top_p, live)
    probs = _softmax(tl.where(drop, float("-inf"), libdevice.div_rn(x, temperature)))
    score = libdevice.div_rn(probs, -libdevice.log(noise))
    choice = tl.argmax(tl.where(live, score, -1.0), 0, tie_break_left=True)
    named = choice < n_ids
    tl.store(token_ptr + row, tl.where(named, id_begin + choice, extra_id).to(tl.int64))
    code = tl.where(named, choice, 0)
    tl.store(code_ptr + row, code.to(tl.int64))
    d = tl.arange(0, BLOCK_D)
    tl.store(embedded_ptr + row * DIM + d, tl.load(embeddings_ptr + code * DIM + d, mask=d < DIM), mask=d < DIM)


def supports(n_logits: int) -> bool:
    return n_logits <= MAX_IDS


@torch.library.custom_op("s1mini::sample_rows", mutates_args=())
def sample_rows(logits: Tensor, history: Tensor, valid: Tensor, temperature: Tensor, top_p: Tensor,
                repetition_penalty: Tensor, noise_key: Tensor, counter: Tensor, embeddings: Tensor,
                id_begin: int, n_ids: int, extra_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """logits (B, V) of the ids 0..V-1; history (B, W) ids as the caller records them, valid (B, W);
    temperature, top_p, repetition_penalty (B, 1) float32; noise_key, counter (B,) int64;
    embeddings (E, D). Index i stands for id id_begin + i while i < n_ids, and for extra_id after;
    a history id is mapped back the same way (others are never penalised; extra_id -1 names none, as
    ids are never negative). Returns the chosen ids (B,) int64, their codes (the index, or 0 for
    extra_id) and the codes' embedding rows (B, D).

    The kernel reads history, valid and noise_key before it waits for the kernel before it (PDL), so
    they are taken as they are (a copy made here would be that kernel): each row's entries adjacent."""
    batch, n_logits = logits.shape
    window, dim = history.shape[1], embeddings.shape[1]
    torch._check(n_logits <= MAX_IDS, lambda: f"sample_rows takes at most {MAX_IDS} logits a row")
    torch._check(window & (window - 1) == 0, lambda: "the history window must be a power of two")
    torch._check(history.stride(1) == 1 and valid.stride(1) == 1 and noise_key.stride(0) == 1,
                 lambda: "history and valid need adjacent entries in a row, noise_key adjacent rows")
    torch._check(embeddings.shape[0] >= min(n_ids, n_logits), lambda: "a code would have no embedding row")
    for t in (temperature, top_p, repetition_penalty):
        torch._check(t.shape == (batch, 1) and t.stride() == temperature.stride(), lambda: "parameters differ in layout")
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device)
    codes = torch.empty_like(tokens)
    embedded = torch.empty((batch, dim), dtype=embeddings.dtype, device=logits.device)
    if batch == 0:
        return tokens, codes, embedded
    logits, embeddings = logits if logits.stride(1) == 1 else logits.contiguous(), embeddings.contiguous()
    block_v = max(16, triton.next_power_of_2(n_logits))
    pdl = pdl_available(logits.device)
    _sample_rows[(batch,)](
        logits, logits.stride(0), history, history.stride(0), valid, valid.stride(0),
        temperature, top_p, repetition_penalty, temperature.stride(0), noise_key, counter, counter.stride(0),
        embeddings, tokens, codes, embedded, n_logits, id_begin, n_ids, extra_id,
        WINDOW=window, DIM=dim, BLOCK_V=block_v, BLOCK_D=triton.next_power_of_2(dim),
        pdl=pdl, **launch_options(pdl), num_warps=max(8, min(16, block_v // 512)))
    return tokens, codes, embedded


@sample_rows.register_fake
def _(logits, history, valid, temperature, top_p, repetition_penalty, noise_key, counter, embeddings,
      id_begin, n_ids, extra_id):
    batch = logits.shape[0]
    tokens = logits.new_empty(batch, dtype=torch.int64)
    return tokens, torch.empty_like(tokens), embeddings.new_empty((batch, embeddings.shape[1]))
