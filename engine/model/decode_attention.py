"""One new token per row attending over the row's own live keys: a Triton kernel for the decode step.

A decode step adds one token per row. After its QKV projection, Attention.attend normalises the
query and key heads (q/k RMSNorm), rotates them (RoPE), writes the key and value into the KV cache
and attends; compiled by Inductor that is five to seven small kernels per layer (about a quarter of
a slow layer's time at batch 1) before any attention. Here one kernel does it all, reading only
each row's live keys (0..position), once; written in PyTorch ops (dual_ar.one_query_attention)
every row reads the whole KV bucket.

Split-KV ("flash decoding"): program (row, kv head, split) normalises and rotates the group of query
heads that share the kv head, attends them over one split of SPLIT_KEYS keys and writes its
normalised partial output and log-sum-exp; a second kernel merges the splits. The split holding the
row's new position writes its key and value into the cache. A split past a row's position reads no
keys and weighs nothing in the merge. The number of splits depends on the bucket (and on a batch of
one row, whose graph is compiled apart), so one compiled graph serves every batch size above one. A
cache of at most MAX_DIRECT_KEYS positions (the fast transformer's 10) is one split per kv head,
which writes the output itself: one kernel, no merge. For one row (early_keys) a program requests
its first block of cached keys and values before the query's math and takes the new key and value
from registers, so that no load waits for the store (a batch-1 frame ~2% faster); batches keep the
store-then-read order, since early loads make a batch-64 step several percent slower.

Registered as a torch.library.triton_op so that Inductor compiles it into the step's graph (and
CUDA graphs capture it). It writes the caches it is given, which Inductor (torch 2.11) compiles
right only when they come into the compiled code as inputs, K and V tensors of their own (see
dual_ar.Attention.use_decode_kernel). On Hopper and newer both kernels let the kernel after them
(a fused_linear projection, launched with PDL) start launching and load its weights early.

One row (the batch-1 step) takes decode_attention_one_row instead: the same kernels launched with
programmatic dependent launch themselves, from a custom op opaque to Inductor (which launches a
triton_op's kernels without PDL on torch 2.11). A program then requests its position, rotation and
first block of cached keys while the QKV projection before it still runs, and waits for that
projection only to read the token (a batch-1 frame ~2% faster). Importing this module needs Triton
and torch >= 2.6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.library import triton_op, wrap_triton

from ..compilation import pdl_available
from .launch_control import launch_options, let_dependents_launch, wait_for_inputs

# Keys per program, and per inner iteration, the fastest when timed: 256 keys at batch 16-64 (near the
# memory's bandwidth), 64 at batch 1, where 256 would leave most SMs idle.
SPLIT_KEYS, ONE_ROW_SPLIT_KEYS, BLOCK_KEYS = 256, 64, 64
NUM_WARPS, NUM_STAGES = 4, 2
MIN_DOT = 16  # tl.dot's smallest dimension: the query group (2 heads for S1-mini) is padded to it
# Splits the merge loads at once for one row (8 at kv 512 make a frame ~1% faster than one at a time);
# batches keep one at a time (8 at 64 rows, kv 512 make a step's merges about twice as slow).
ONE_ROW_MERGE_BLOCK = 8
MAX_DIRECT_KEYS = 64  # caches up to this capacity are attended by one program per kv head, unsplit


@triton.jit
def _norm_and_rotate(ptr, rows, live, d, norm_ptr, eps, cos, sin, head_dim: tl.constexpr,
                     has_norm: tl.constexpr, dtype: tl.constexpr):
    """Heads `rows` of the token at ptr ([R, head_dim]) as Attention.attend makes them: RMSNorm
    (normalised in fp32, rounded, scaled by the weight, rounded), then RoPE on interleaved pairs in
    fp32, rounded. Each element's pair partner (d ^ 1) is loaded apart, so that the rotation is
    elementwise: no reshaping of the head in registers."""
    partner = d ^ 1
    x = tl.load(ptr + rows[:, None] * head_dim + d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    x_partner = tl.load(ptr + rows[:, None] * head_dim + partner[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    if has_norm:
        inv_rms = tl.rsqrt(tl.sum(x * x, 1) / head_dim + eps)[:, None]
        x = ((x * inv_rms).to(dtype).to(tl.float32) * tl.load(norm_ptr + d).to(tl.float32)[None, :]).to(dtype)
        x_partner = ((x_partner * inv_rms).to(dtype).to(tl.float32)
                     * tl.load(norm_ptr + partner).to(tl.float32)[None, :]).to(dtype)
        x, x_partner = x.to(tl.float32), x_partner.to(tl.float32)
    # (x[2i], x[2i+1]) -> (x[2i] cos_i - x[2i+1] sin_i, x[2i+1] cos_i + x[2i] sin_i)
    odd = (d & 1)[None, :] == 1
    return tl.where(odd, x * cos + x_partner * sin, x * cos - x_partner * sin).to(dtype)


@triton.jit
def _load_old_keys(k_base, v_base, first, end, position, k_stride_l, v_stride_l, d, block_keys: tl.constexpr):
    """The cached keys and values of positions first .. first + block_keys - 1 below end, but the new
    position's (its slot is being written; the caller has its values): zeros where not read."""
    n = first + tl.arange(0, block_keys)
    old = ((n < end) & (n != position))[:, None]
    k = tl.load(k_base + n[:, None] * k_stride_l + d[None, :], mask=old, other=0.0)
    v = tl.load(v_base + n[:, None] * v_stride_l + d[None, :], mask=old, other=0.0)
    return k, v


@triton.jit
def _attend_split(qkv_ptr, q_norm_ptr, k_norm_ptr, eps, rope_ptr, positions_ptr, k_ptr, v_ptr,
                  partial_ptr, lse_ptr, out_ptr, n_keys, qkv_stride_b, rope_stride_b,
                  k_stride_b, k_stride_h, k_stride_l, v_stride_b, v_stride_h, v_stride_l,
                  scale_log2: tl.constexpr, n_heads: tl.constexpr, kv_heads: tl.constexpr, group: tl.constexpr,
                  rows: tl.constexpr, head_dim: tl.constexpr, has_qk_norm: tl.constexpr,
                  split_keys: tl.constexpr, block_keys: tl.constexpr, ieee: tl.constexpr, direct: tl.constexpr,
                  early_keys: tl.constexpr, pdl: tl.constexpr, launched_pdl: tl.constexpr):
    if pdl:  # the kernel after (a projection) may launch now and load its weights; it waits for our output
        positions_ptr += let_dependents_launch()
    b, h, split = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    dtype = qkv_ptr.dtype.element_ty
    position = tl.load(positions_ptr + b)
    start = split * split_keys
    end = tl.minimum(start + split_keys, tl.minimum(position + 1, n_keys))  # none when start >= end
    g = tl.arange(0, rows)
    d = tl.arange(0, head_dim)
    if early_keys:  # the first block's keys and values are on their way during the query's norm and rotation
        k_base = k_ptr + b * k_stride_b + h * k_stride_h
        v_base = v_ptr + b * v_stride_b + h * v_stride_h
        k, v = _load_old_keys(k_base, v_base, start, end, position, k_stride_l, v_stride_l, d, block_keys)
    cos = tl.load(rope_ptr + b * rope_stride_b + (d // 2) * 2).to(tl.float32)[None, :]
    sin = tl.load(rope_ptr + b * rope_stride_b + (d // 2) * 2 + 1).to(tl.float32)[None, :]
    if launched_pdl:
        # Launched while the QKV projection runs: the loads above read what earlier kernels wrote
        # (positions, rotations, keys of earlier positions), complete before that projection started.
        qkv_ptr += wait_for_inputs()
    row = qkv_ptr + b * qkv_stride_b
    # This kv head's query heads (h * group ..), normed and rotated.
    q = _norm_and_rotate(row, h * group + g, g < group, d, q_norm_ptr, eps, cos, sin, head_dim, has_qk_norm, dtype)
    if early_keys:
        # The new key and value, written by the split holding the new position, are used from
        # registers, as stored, where a block reaches that position: no block waits for the store.
        one = tl.arange(0, 1)
        k_new = _norm_and_rotate(row, n_heads + h + one, one == 0, d, k_norm_ptr, eps, cos, sin, head_dim,
                                 has_qk_norm, dtype)
        v_new = tl.load(row + (n_heads + kv_heads + h) * head_dim + d)[None, :]
        holds_new = (position >= start) & (position < start + split_keys) & (position < n_keys)
        tl.store(k_base + position * k_stride_l + d[None, :], k_new, mask=holds_new)
        tl.store(v_base + position * v_stride_l + d[None, :], v_new, mask=holds_new)
    else:  # (k_base and v_base here, not above: each mode then compiles to the PTX of the kernel timed)
        k_base = k_ptr + b * k_stride_b + h * k_stride_h
        v_base = v_ptr + b * v_stride_b + h * v_stride_h
        if (position >= start) & (position < start + split_keys) & (position < n_keys):
            # The split holding the new position writes its key and value into the cache.
            one = tl.arange(0, 1)
            k_new = _norm_and_rotate(row, n_heads + h + one, one == 0, d, k_norm_ptr, eps, cos, sin, head_dim,
                                     has_qk_norm, dtype)
            tl.store(k_base + position * k_stride_l + d[None, :], k_new)
            tl.store(v_base + position * v_stride_l + d, tl.load(row + (n_heads + kv_heads + h) * head_dim + d))
        tl.debug_barrier()  # makes those stores visible to every thread of this program before the loads below
    running_max = tl.full([rows], float("-inf"), tl.float32)
    running_sum = tl.zeros([rows], tl.float32)
    acc = tl.zeros([rows, head_dim], tl.float32)
    for first in range(start, end, block_keys):
        n = first + tl.arange(0, block_keys)
        live = n < end
        if early_keys:
            is_new = ((n == position) & live)[:, None]
            k, v = tl.where(is_new, k_new, k), tl.where(is_new, v_new, v)
        else:
            k = tl.load(k_base + n[:, None] * k_stride_l + d[None, :], mask=live[:, None], other=0.0)
        if ieee:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(live[None, :], scores * scale_log2, float("-inf"))  # log2 units: exp2 below
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        probs = tl.exp2(scores - new_max[:, None])
        rescale = tl.exp2(running_max - new_max)
        running_sum = running_sum * rescale + tl.sum(probs, 1)
        if not early_keys:
            v = tl.load(v_base + n[:, None] * v_stride_l + d[None, :], mask=live[:, None], other=0.0)
        if ieee:
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v)
        running_max = new_max
        if early_keys:  # the next block's (nothing is read past end)
            k, v = _load_old_keys(k_base, v_base, first + block_keys, end, position, k_stride_l, v_stride_l, d,
                                  block_keys)
    if direct:  # one split: the output itself, (B, n_heads * head_dim)
        tl.store(out_ptr + (b * n_heads + h * group + g[:, None]) * head_dim + d[None, :],
                 (acc / running_sum[:, None]).to(dtype), mask=(g < group)[:, None])
    else:
        # A split past the row's length stores lse -inf and zeros: it weighs nothing in the merge.
        attended = running_sum > 0
        safe_sum = tl.where(attended, running_sum, 1.0)
        out_offset = ((b * kv_heads + h) * tl.num_programs(2) + split) * group
        tl.store(lse_ptr + out_offset + g, tl.where(attended, running_max + tl.log2(safe_sum), float("-inf")),
                 mask=g < group)
        tl.store(partial_ptr + (out_offset + g[:, None]) * head_dim + d[None, :],
                 tl.where(attended[:, None], acc / safe_sum[:, None], 0.0), mask=(g < group)[:, None])


@triton.jit
def _merge_splits(partial_ptr, lse_ptr, out_ptr, splits, group: tl.constexpr, head_dim: tl.constexpr,
                  split_block: tl.constexpr, pdl: tl.constexpr, launched_pdl: tl.constexpr):
    if pdl:
        lse_ptr += let_dependents_launch()
    if launched_pdl:  # launched while the attention runs
        after = wait_for_inputs()
        lse_ptr += after
        partial_ptr += after
    row, g = tl.program_id(0).to(tl.int64), tl.program_id(1)  # row: (batch row, kv head) flattened
    d = tl.arange(0, head_dim)
    base = row * splits * group + g
    # split_block splits a load: one round trip to L2 per block rather than one per split.
    top = tl.full([split_block], float("-inf"), tl.float32)
    for first in range(0, splits, split_block):
        s = first + tl.arange(0, split_block)
        top = tl.maximum(top, tl.load(lse_ptr + base + s * group, mask=s < splits, other=float("-inf")))
    top = tl.max(top, 0)
    total = tl.zeros([split_block], tl.float32)
    acc = tl.zeros([split_block, head_dim], tl.float32)
    for first in range(0, splits, split_block):
        s = first + tl.arange(0, split_block)
        live = s < splits
        weight = tl.exp2(tl.load(lse_ptr + base + s * group, mask=live, other=float("-inf")) - top)
        total += weight
        acc += weight[:, None] * tl.load(partial_ptr + (base + s * group)[:, None] * head_dim + d[None, :],
                                         mask=live[:, None], other=0.0)
    merged = tl.sum(acc, 0) / tl.sum(total, 0)
    tl.store(out_ptr + (row * group + g) * head_dim + d, merged.to(out_ptr.dtype.element_ty))


def supports(head_dim: int) -> bool:
    """Whether the kernel serves heads of this size (on CUDA): a power of two that tl.dot accepts."""
    return head_dim >= MIN_DOT and head_dim & (head_dim - 1) == 0


def launch(attend, merge, qkv: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float, rope: Tensor,
           k_cache: Tensor, v_cache: Tensor, positions: Tensor, n_keys, n_heads: int, one_row: bool,
           launched_pdl: bool = False) -> Tensor:
    """Run the kernels (_attend_split and _merge_splits, or them wrapped for Inductor); see decode_attention.
    launched_pdl: launch them with programmatic dependent launch (raw kernels only; where pdl_available)."""
    batch, kv_heads, capacity, head_dim = k_cache.shape
    group = n_heads // kv_heads
    torch._check(k_cache.stride(3) == 1 and v_cache.stride(3) == 1, lambda: "the caches need unit stride on D")
    qkv, rope, positions = qkv.contiguous(), rope.contiguous(), positions.contiguous()
    out = torch.empty((batch, n_heads * head_dim), device=qkv.device, dtype=qkv.dtype)
    # A cache that one program covers (the fast transformer's 10 positions) needs no merge.
    direct = capacity <= MAX_DIRECT_KEYS
    split_keys = triton.next_power_of_2(capacity) if direct else ONE_ROW_SPLIT_KEYS if one_row else SPLIT_KEYS
    splits = 1 if direct else triton.cdiv(n_keys, split_keys)
    if direct:  # nothing to merge: the kernel neither reads nor writes partial and lse
        partial = lse = qkv
    else:
        partial = torch.empty((batch, kv_heads, splits, group, head_dim), device=qkv.device, dtype=torch.float32)
        lse = torch.empty((batch, kv_heads, splits, group), device=qkv.device, dtype=torch.float32)
    log2e = 1.4426950408889634
    pdl = pdl_available(qkv.device)
    launched_pdl = launched_pdl and pdl
    pdl_options = launch_options(launched_pdl)
    attend[(batch, kv_heads, splits)](
        qkv, qkv if q_norm is None else q_norm, qkv if k_norm is None else k_norm, eps, rope, positions,
        k_cache, v_cache, partial, lse, out, n_keys, qkv.stride(0), rope.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        scale_log2=head_dim ** -0.5 * log2e, n_heads=n_heads, kv_heads=kv_heads, group=group,
        rows=max(MIN_DOT, triton.next_power_of_2(group)), head_dim=head_dim, has_qk_norm=q_norm is not None,
        split_keys=split_keys, block_keys=min(BLOCK_KEYS, split_keys), ieee=qkv.dtype == torch.float32,
        direct=direct, early_keys=one_row, pdl=pdl, launched_pdl=launched_pdl, num_warps=NUM_WARPS,
        num_stages=NUM_STAGES, **pdl_options)
    if not direct:
        merge[(batch * kv_heads, group)](partial, lse, out, splits, group=group, head_dim=head_dim,
                                           split_block=ONE_ROW_MERGE_BLOCK if one_row else 1, pdl=pdl,
                                           launched_pdl=launched_pdl, **pdl_options)
    return out


@triton_op("s1mini::decode_attention", mutates_args={"k_cache", "v_cache"})
def decode_attention(qkv: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float, rope: Tensor,
                     k_cache: Tensor, v_cache: Tensor, positions: Tensor, n_keys: int, n_heads: int) -> Tensor:
    """One new token per row: the rest of Attention.attend after the QKV projection, in one kernel
    (two when the keys are split).

    qkv (B, (n_heads + 2 H_kv) D): the projected token, query heads then keys then values; q_norm,
    k_norm (D,) RMSNorm weights or None (eps their epsilon); rope (B, D/2, 2) each row's [cos, sin]
    at its position; k_cache, v_cache (B, H_kv, capacity, D) with unit stride on D; positions (B,)
    int64. Row b's key and value are written at positions[b], then its queries attend keys
    0..min(positions[b] + 1, n_keys) - 1. Returns (B, n_heads D) in qkv's dtype; scores, softmax
    and sums in fp32. For torch.compile, see the module docstring on the caches."""
    one_row = statically_known_true(qkv.shape[0] == 1)
    return launch(wrap_triton(_attend_split), wrap_triton(_merge_splits), qkv, q_norm, k_norm, eps, rope,
                  k_cache, v_cache, positions, n_keys, n_heads, one_row)


# No defaults: torch 2.11 drops a mutated custom-op argument that has one.
@torch.library.custom_op("s1mini::decode_attention_one_row", mutates_args=("k_cache", "v_cache"))
def decode_attention_one_row(qkv: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float, rope: Tensor,
                             k_cache: Tensor, v_cache: Tensor, positions: Tensor, n_keys: int, n_heads: int) -> Tensor:
    """decode_attention for one row (qkv (1, ...)), its kernels launched with programmatic dependent
    launch: each program requests its position, rotation and first block of cached keys while the
    QKV projection before it still runs, and waits for that projection only to read the token.
    Inductor launches a triton_op's kernels without PDL (torch 2.11), so this one is opaque to it,
    as fused_linear is."""
    torch._check(qkv.shape[0] == 1, lambda: "decode_attention_one_row takes one row")
    return launch(_attend_split, _merge_splits, qkv, q_norm, k_norm, eps, rope, k_cache, v_cache, positions, n_keys,
                  n_heads, one_row=True, launched_pdl=True)


@decode_attention_one_row.register_fake
def _(qkv: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float, rope: Tensor, k_cache: Tensor,
      v_cache: Tensor, positions: Tensor, n_keys: int, n_heads: int) -> Tensor:
    return qkv.new_empty((1, n_heads * k_cache.shape[3]))
