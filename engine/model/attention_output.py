"""A batch-1 decode step's attention over a short cache and the output projection after it, in one kernel.

The fast transformer attends over at most 10 positions (one per codebook). At batch 1 its attention
kernel (decode_attention, one program per kv head) did ~1 us of work but cost a launch of its own
between the QKV and output projections, and Inductor launches it without programmatic dependent
launch, so the output projection could not load its weights early. Here every program of the output
projection attends itself, over all heads (a few KB of keys and values, from L2), then multiplies
its columns of wo:

    out = residual + attend(qkv, cache) @ wo^T

with the new key and value written into the cache by program 0 (the others take them from qkv).
Rounding follows decode_attention and fused_linear: q and k normed and rotated and rounded, scores,
softmax and the weighted values in fp32 (no tl.dot here, so the probabilities need not be rounded to
the values' dtype), the attended row rounded before the projection, products summed in fp32.

A custom op launched with PDL like fused_linear (see there); for a cache of at most MAX_KEYS
positions, heads and head size powers of two. Importing this module needs Triton and torch >= 2.6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..compilation import pdl_available
from .decode_attention import _norm_and_rotate
from .launch_control import wait_for_inputs

MAX_KEYS = 16  # every program holds all heads' keys and values: (heads, MAX_KEYS, head_dim) each
BLOCK_N, NUM_WARPS = 4, 8  # output columns per program, as fused_linear's Launch


@triton.jit
def _attention_output(qkv_ptr, q_norm_ptr, k_norm_ptr, eps, rope_ptr, positions_ptr, k_ptr, v_ptr,
                      w_ptr, w_scale_ptr, residual_ptr, out_ptr, n_keys,
                      k_stride_h, k_stride_l, v_stride_h, v_stride_l,
                      scale_log2: tl.constexpr, n_heads: tl.constexpr, kv_heads: tl.constexpr,
                      head_dim: tl.constexpr, keys: tl.constexpr, N: tl.constexpr, has_qk_norm: tl.constexpr,
                      has_w_scale: tl.constexpr, block_n: tl.constexpr, pdl: tl.constexpr,
                      weight_eviction: tl.constexpr):
    K: tl.constexpr = n_heads * head_dim
    group: tl.constexpr = n_heads // kv_heads
    n = tl.program_id(0) * block_n + tl.arange(0, block_n)
    live_n = n < N
    # This program's rows of wo: loaded before anything the kernel before writes (wait_for_inputs).
    w = tl.load(w_ptr + n[:, None] * K + tl.arange(0, K)[None, :], mask=live_n[:, None], other=0.0,
                eviction_policy=weight_eviction)
    if pdl:
        after = wait_for_inputs()
        qkv_ptr += after
        positions_ptr += after
        residual_ptr += after
        rope_ptr += after
        k_ptr += after
        v_ptr += after
    dtype = qkv_ptr.dtype.element_ty
    position = tl.load(positions_ptr)
    heads = tl.arange(0, n_heads)
    kv_head = heads // group  # each query head's kv head
    d = tl.arange(0, head_dim)
    cos = tl.load(rope_ptr + (d // 2) * 2).to(tl.float32)[None, :]
    sin = tl.load(rope_ptr + (d // 2) * 2 + 1).to(tl.float32)[None, :]
    every = heads < n_heads
    q = _norm_and_rotate(qkv_ptr, heads, every, d, q_norm_ptr, eps, cos, sin, head_dim, has_qk_norm, dtype)
    k_new = _norm_and_rotate(qkv_ptr + K, kv_head, every, d, k_norm_ptr, eps, cos, sin, head_dim, has_qk_norm, dtype)
    v_new = tl.load(qkv_ptr + K + kv_heads * head_dim + kv_head[:, None] * head_dim + d[None, :])
    # (head, key, d): the cached keys and values before the new position, the new ones at it.
    j = tl.arange(0, keys)
    cached = ((j < position) & (j < n_keys))[None, :, None]
    at_new = (j == position)[None, :, None]
    k_all = tl.load(k_ptr + kv_head[:, None, None] * k_stride_h + j[None, :, None] * k_stride_l + d[None, None, :],
                    mask=cached, other=0.0)
    k_all = tl.where(at_new, k_new[:, None, :], k_all)
    scores = tl.sum(q.to(tl.float32)[:, None, :] * k_all.to(tl.float32), 2) * scale_log2  # log2 units
    visible = ((j <= position) & (j < n_keys))[None, :]
    scores = tl.where(visible, scores, float("-inf"))
    probs = tl.exp2(scores - tl.max(scores, 1)[:, None])
    total = tl.sum(probs, 1)
    v_all = tl.load(v_ptr + kv_head[:, None, None] * v_stride_h + j[None, :, None] * v_stride_l + d[None, None, :],
                    mask=cached, other=0.0)
    v_all = tl.where(at_new, v_new[:, None, :], v_all)
    weighted = tl.sum(probs[:, :, None] * v_all.to(tl.float32), 1)
    attended = (weighted / total[:, None]).to(dtype)  # (n_heads, head_dim)
    if tl.program_id(0) == 0:  # the first head of each group writes its kv head's new key and value
        first = (heads % group == 0)[:, None]
        tl.store(k_ptr + kv_head[:, None] * k_stride_h + position * k_stride_l + d[None, :], k_new, mask=first)
        tl.store(v_ptr + kv_head[:, None] * v_stride_h + position * v_stride_l + d[None, :], v_new, mask=first)
    row = tl.reshape(attended.to(tl.float32), [K])
    sums = tl.sum(w.to(tl.float32) * row[None, :], 1)
    if has_w_scale:  # int8 rows of wo: one scale per output row
        sums *= tl.load(w_scale_ptr + n, mask=live_n, other=0.0).to(tl.float32)
    out = (tl.load(residual_ptr + n, mask=live_n, other=0.0).to(tl.float32) + sums.to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + n, out, mask=live_n)


def supports(n_heads: int, head_dim: int, capacity: int) -> bool:
    """Whether the kernel serves this attention: powers of two for the heads and their size (tl.arange),
    a cache every program holds whole."""
    def power_of_two(x: int) -> bool:
        return x > 0 and x & (x - 1) == 0
    return power_of_two(n_heads) and power_of_two(head_dim) and capacity <= MAX_KEYS


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
        block_n=BLOCK_N, pdl=pdl, launch_pdl=pdl, weight_eviction=weight_eviction, num_warps=NUM_WARPS, num_stages=1)
    return out


@attention_output.register_fake
def _(qkv, q_norm, k_norm, eps, rope, k_cache, v_cache, position, n_keys, n_heads, weight, weight_scale, residual,
      weight_eviction=""):
    return qkv.new_empty((1, weight.shape[0]))
