"""One query per head attending over each row's own live keys: a Triton kernel for the decode step.

A batched decode step reads the KV cache up to a bucket that covers its longest row. Written in
PyTorch ops (dual_ar.one_query_attention), every row reads the whole bucket, with scores, softmax
and P x V as three kernels; at batch 64 and bucket 1024 they took 3.7 of the step's 7.7 ms on an
H100 (docs/PERFORMANCE.md). Here each row reads only its live keys (0..length-1), once.

Split-KV ("flash decoding"): program (row, kv head, split) attends the group of query heads that
share the kv head over one split of SPLIT_KEYS keys and writes its normalised partial output and
log-sum-exp; a second kernel merges the splits. A split past a row's length reads no keys and
weighs nothing in the merge. The number of splits depends on the bucket (and on a batch of one
row, whose graph is compiled apart), so one compiled graph serves every batch size above one.

Registered as a torch.library.triton_op so that Inductor compiles it into the step's graph (and
CUDA graphs capture it). The compiled step's slow layers use it; the fast layers attend at most 10
keys, where it saved nothing (docs/PERFORMANCE.md). Importing this module needs Triton and torch >= 2.6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.library import triton_op, wrap_triton

# Keys per program, and per inner iteration. Timed on an H100 (docs/PERFORMANCE.md): 256 keys at
# batch 16-64 (2.6 TB/s), 64 at batch 1, where 256 would leave most SMs idle.
SPLIT_KEYS, ONE_ROW_SPLIT_KEYS, BLOCK_KEYS = 256, 64, 64
NUM_WARPS, NUM_STAGES = 4, 2
MIN_DOT = 16  # tl.dot's smallest dimension: the query group (2 heads for S1-mini) is padded to it


@triton.jit
def _attend_split(q_ptr, k_ptr, v_ptr, lengths_ptr, partial_ptr, lse_ptr, n_keys,
                  q_stride_b, q_stride_h, q_stride_g,
                  k_stride_b, k_stride_h, k_stride_l,
                  v_stride_b, v_stride_h, v_stride_l,
                  scale_log2: tl.constexpr, group: tl.constexpr, rows: tl.constexpr, head_dim: tl.constexpr,
                  split_keys: tl.constexpr, block_keys: tl.constexpr, ieee: tl.constexpr):
    b, h, split = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    start = split * split_keys
    end = tl.minimum(start + split_keys, tl.minimum(tl.load(lengths_ptr + b), n_keys))  # none when start >= end
    g = tl.arange(0, rows)
    d = tl.arange(0, head_dim)
    q = tl.load(q_ptr + b * q_stride_b + h * q_stride_h + g[:, None] * q_stride_g + d[None, :],
                mask=(g < group)[:, None], other=0.0)
    k_base = k_ptr + b * k_stride_b + h * k_stride_h
    v_base = v_ptr + b * v_stride_b + h * v_stride_h
    running_max = tl.full([rows], float("-inf"), tl.float32)
    running_sum = tl.zeros([rows], tl.float32)
    acc = tl.zeros([rows, head_dim], tl.float32)
    for first in range(start, end, block_keys):
        n = first + tl.arange(0, block_keys)
        live = n < end
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
        v = tl.load(v_base + n[:, None] * v_stride_l + d[None, :], mask=live[:, None], other=0.0)
        if ieee:
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v)
        running_max = new_max
    # A split past the row's length stores lse -inf and zeros: it weighs nothing in the merge.
    attended = running_sum > 0
    safe_sum = tl.where(attended, running_sum, 1.0)
    out_offset = ((b * tl.num_programs(1) + h) * tl.num_programs(2) + split) * group
    tl.store(lse_ptr + out_offset + g, tl.where(attended, running_max + tl.log2(safe_sum), float("-inf")),
             mask=g < group)
    tl.store(partial_ptr + (out_offset + g[:, None]) * head_dim + d[None, :],
             tl.where(attended[:, None], acc / safe_sum[:, None], 0.0), mask=(g < group)[:, None])


@triton.jit
def _merge_splits(partial_ptr, lse_ptr, out_ptr, splits, group: tl.constexpr, head_dim: tl.constexpr):
    row, g = tl.program_id(0).to(tl.int64), tl.program_id(1)  # row: (batch row, kv head) flattened
    d = tl.arange(0, head_dim)
    one = tl.arange(0, 1)
    base = row * splits * group + g
    top = tl.full([1], float("-inf"), tl.float32)
    for s in range(0, splits):
        top = tl.maximum(top, tl.load(lse_ptr + base + s * group + one))
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([head_dim], tl.float32)
    for s in range(0, splits):
        weight = tl.exp2(tl.load(lse_ptr + base + s * group + one) - top)
        total += weight
        acc += weight * tl.load(partial_ptr + (base + s * group) * head_dim + d)
    tl.store(out_ptr + (row * group + g) * head_dim + d, (acc / total).to(out_ptr.dtype.element_ty))


def supports(q: Tensor) -> bool:
    """Whether the kernel takes q (B, H_kv, G, D): on CUDA, D a power of two that tl.dot accepts."""
    head_dim = q.shape[-1]
    return q.is_cuda and head_dim >= MIN_DOT and head_dim & (head_dim - 1) == 0


@triton_op("s1mini::decode_attention", mutates_args={})
def decode_attention(q: Tensor, keys: Tensor, values: Tensor, lengths: Tensor) -> Tensor:
    """q (B, H_kv, G, D): the G query heads sharing each kv head; keys, values (B, H_kv, L, D) with
    unit stride on D; lengths (B,) int >= 1: row b attends keys 0..min(lengths[b], L)-1.
    Returns (B, H_kv, G, D) in q's dtype; scores, softmax and sums in fp32."""
    batch, kv_heads = q.shape[:2]
    group, head_dim = int(q.shape[2]), int(q.shape[3])  # compile-time constants of the kernels
    split_keys = ONE_ROW_SPLIT_KEYS if statically_known_true(batch == 1) else SPLIT_KEYS
    splits = triton.cdiv(keys.shape[2], split_keys)
    torch._check(keys.stride(3) == 1 and values.stride(3) == 1, lambda: "keys and values need unit stride on D")
    q, lengths = q.contiguous(), lengths.contiguous()
    partial = torch.empty((batch, kv_heads, splits, group, head_dim), device=q.device, dtype=torch.float32)
    lse = torch.empty((batch, kv_heads, splits, group), device=q.device, dtype=torch.float32)
    log2e = 1.4426950408889634
    wrap_triton(_attend_split)[(batch, kv_heads, splits)](
        q, keys, values, lengths, partial, lse, keys.shape[2],
        q.stride(0), q.stride(1), q.stride(2),
        keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        scale_log2=head_dim ** -0.5 * log2e, group=group, rows=max(MIN_DOT, triton.next_power_of_2(group)),
        head_dim=head_dim, split_keys=split_keys, block_keys=BLOCK_KEYS, ieee=q.dtype == torch.float32,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    out = torch.empty_like(q)
    wrap_triton(_merge_splits)[(batch * kv_heads, group)](partial, lse, out, splits, group=group, head_dim=head_dim)
    return out
