"""A batch-1 decode step's attention over a short cache and the output projection after it, in one kernel.

The fast transformer attends over at most 10 positions (one per codebook). At batch 1 its attention
kernel (decode_attention, one program per kv head) did ~1 us of work but cost a launch of its own
between the QKV and output projections, and Inductor launches it without programmatic dependent
launch, so the output projection could not load its weights early. Here every program of the output
projection attends itself, over all heads (a few KB of keys and values, from L2), then multiplies
its columns of wo:

    out = residual + attend(qkv, cache) @ wo^T

with the new key and value written into the cache by program 0 (the others take them from qkv).
Rounding follows decode_attention and fused_linear: q and k normed and rotated and rounded, scores
and softmax in fp32, probabilities rounded before they weigh the values, the attended row rounded
before the projection, products summed in fp32.

A custom op launched with PDL like fused_linear (see there), which reads every input but qkv before
it waits for the kernel before: that kernel must write nothing else (in the decode step it is the
QKV projection). For a cache of at most MAX_KEYS positions, heads and head size powers of two. Importing this module needs Triton and torch >= 2.6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..compilation import pdl_available
from .decode_attention import _norm_and_rotate
from .launch_control import wait_for_inputs

MAX_KEYS = 16  # every program holds every kv head's keys and values: (kv_heads * MAX_KEYS, head_dim) each
BLOCK_N, NUM_WARPS = 8, 8  # output columns per program (each program attends, so fewer than fused_linear's)


@triton.jit
def _attention_output(qkv_ptr, q_norm_ptr, k_norm_ptr, eps, rope_ptr, positions_ptr, k_ptr, v_ptr,
                      w_ptr, w_scale_ptr, residual_ptr, out_ptr, n_keys,
                      k_stride_h, k_stride_l, v_stride_h, v_stride_l,
                      scale_log2: tl.constexpr, n_heads: tl.constexpr, kv_heads: tl.constexpr,
                      head_dim: tl.constexpr, keys: tl.constexpr, N: tl.constexpr, has_qk_norm: tl.constexpr,
                      has_w_scale: tl.constexpr, ieee: tl.constexpr, block_n: tl.constexpr, pdl: tl.constexpr,
                      weight_eviction: tl.constexpr):
    K: tl.constexpr = n_heads * head_dim
    group: tl.constexpr = n_heads // kv_heads
    n = tl.program_id(0) * block_n + tl.arange(0, block_n)
    live_n = n < N
    # Everything but qkv is read before waiting for the kernel before (wait_for_inputs): that kernel
    # is the QKV projection, which writes qkv alone, and it lets this one launch only once everything
    # before it has finished. So the weights, the cached keys and values and the residual are in
    # flight while the projection still runs.
    w = tl.load(w_ptr + n[:, None] * K + tl.arange(0, K)[None, :], mask=live_n[:, None], other=0.0,
                eviction_policy=weight_eviction)
    residual = tl.load(residual_ptr + n, mask=live_n, other=0.0).to(tl.float32)
    position = tl.load(positions_ptr)
    d = tl.arange(0, head_dim)
    cos = tl.load(rope_ptr + (d // 2) * 2).to(tl.float32)[None, :]
    sin = tl.load(rope_ptr + (d // 2) * 2 + 1).to(tl.float32)[None, :]
    # Every kv head's keys side by side, (kv head, key) per row, each head's new key at its
    # position: one matmul scores all query heads against all of them, and a query head's scores
    # outside its own kv head are masked out (the same for the values).
    c = tl.arange(0, kv_heads * keys)
    c_head, c_key = c // keys, c % keys
    cached = ((c_key < position) & (c_key < n_keys))[:, None]
    at_new = (c_key == position)[:, None]
    k_all = tl.load(k_ptr + c_head[:, None] * k_stride_h + c_key[:, None] * k_stride_l + d[None, :], mask=cached,
                    other=0.0)
    v_all = tl.load(v_ptr + c_head[:, None] * v_stride_h + c_key[:, None] * v_stride_l + d[None, :], mask=cached,
                    other=0.0)
    if pdl:
        qkv_ptr += wait_for_inputs()
    dtype = qkv_ptr.dtype.element_ty
    heads = tl.arange(0, n_heads)
    q = _norm_and_rotate(qkv_ptr, heads, heads < n_heads, d, q_norm_ptr, eps, cos, sin, head_dim, has_qk_norm, dtype)
    k_new = _norm_and_rotate(qkv_ptr + K, c_head, c_head < kv_heads, d, k_norm_ptr, eps, cos, sin, head_dim,
                             has_qk_norm, dtype)  # every row: its kv head's new key
    k_all = tl.where(at_new, k_new, k_all)
    if ieee:
        scores = tl.dot(q, tl.trans(k_all), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k_all))
    visible = ((heads // group)[:, None] == c_head[None, :]) & ((c_key <= position) & (c_key < n_keys))[None, :]
    scores = tl.where(visible, scores * scale_log2, float("-inf"))  # log2 units: exp2 below
    probs = tl.exp2(scores - tl.max(scores, 1)[:, None])
    total = tl.sum(probs, 1)
    v_new = tl.load(qkv_ptr + K + kv_heads * head_dim + c_head[:, None] * head_dim + d[None, :])
    v_all = tl.where(at_new, v_new, v_all)
    if ieee:
        weighted = tl.dot(probs.to(dtype), v_all, input_precision="ieee")
    else:
        weighted = tl.dot(probs.to(dtype), v_all)
    attended = (weighted / total[:, None]).to(dtype)  # (n_heads, head_dim)
    if tl.program_id(0) == 0:  # one row per kv head writes its new key and value
        first = (c_key == 0)[:, None]
        tl.store(k_ptr + c_head[:, None] * k_stride_h + position * k_stride_l + d[None, :], k_new, mask=first)
        tl.store(v_ptr + c_head[:, None] * v_stride_h + position * v_stride_l + d[None, :], v_new, mask=first)
    row = tl.reshape(attended.to(tl.float32), [K])
    sums = tl.sum(w.to(tl.float32) * row[None, :], 1)
    if has_w_scale:  # int8 rows of wo: one scale per output row
        sums *= tl.load(w_scale_ptr + n, mask=live_n, other=0.0).to(tl.float32)
    out = (residual + sums.to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + n, out, mask=live_n)


def supports(n_heads: int, head_dim: int, capacity: int) -> bool:
    """Whether the kernel serves this attention: powers of two for the heads (at least 16, tl.dot's
    smallest side) and their size, a cache every program holds whole."""
    def power_of_two(x: int) -> bool:
        return x > 0 and x & (x - 1) == 0
    return power_of_two(n_heads) and n_heads >= 16 and power_of_two(head_dim) and head_dim >= 16 \
        and capacity <= MAX_KEYS


@torch.library.custom_op("s1mini::attention_output", mutates_args={"k_cache", "v_cache"})
def attention_output(qkv: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float, rope: Tensor,
                     k_cache: Tensor, v_cache: Tensor, position: Tensor, n_keys: int, n_heads: int,
                     weight: Tensor, weight_scale: Tensor | None, residual: Tensor,
                     weight_eviction: str = "") -> Tensor:
    """residual + attention(qkv) @ weight^T for one row. qkv (1, (n_heads + 2 H_kv) D), q_norm and k_norm
    (D,) or None (eps their epsilon), rope (1, D) the [cos, sin] pairs at the new position, k_cache and
    v_cache (1, H_kv, capacity, D) unit stride on D, position (1,) int64 (keys 0..min(position + 1,
    n_keys) - 1 are attended; the new key and value are written at position), weight (N, n_heads D)
    or int8 with weight_scale (N,), residual (1, N). Returns (1, N) in qkv's dtype."""
    torch._check(qkv.shape[0] == 1, lambda: "attention_output takes one row")
    _, kv_heads, capacity, head_dim = k_cache.shape
    torch._check(k_cache.stride(3) == 1 and v_cache.stride(3) == 1, lambda: "the caches need unit stride on D")
    columns = weight.shape[0]
    out = torch.empty((1, columns), device=qkv.device, dtype=qkv.dtype)
    pdl = pdl_available(qkv.device)
    _attention_output[(triton.cdiv(columns, BLOCK_N),)](
        qkv.contiguous(), qkv if q_norm is None else q_norm, qkv if k_norm is None else k_norm, eps, rope.contiguous(),
        position.contiguous(), k_cache, v_cache, weight.contiguous(),
        qkv if weight_scale is None else weight_scale.contiguous(), residual.contiguous(), out, n_keys,
        k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
        scale_log2=head_dim ** -0.5 * 1.4426950408889634, n_heads=n_heads, kv_heads=kv_heads, head_dim=head_dim,
        keys=MAX_KEYS, N=columns, has_qk_norm=q_norm is not None, has_w_scale=weight_scale is not None,
        ieee=qkv.dtype == torch.float32, block_n=BLOCK_N, pdl=pdl, launch_pdl=pdl, weight_eviction=weight_eviction, num_warps=NUM_WARPS, num_stages=1)
    return out


@attention_output.register_fake
def _(qkv, q_norm, k_norm, eps, rope, k_cache, v_cache, position, n_keys, n_heads, weight, weight_scale, residual,
      weight_eviction=""):
    return qkv.new_empty((1, weight.shape[0]))
