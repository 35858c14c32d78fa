"""The S1-mini text-to-semantic model: a dual autoregressive transformer.

The slow transformer reads one column of 11 ints per position (a vocabulary id and 10 codebook
codes) and predicts the next frame's vocabulary id (codebook 0 as a semantic token). The fast
transformer then runs over the 10 codebook positions of that frame, predicting codes 1..9.

Pure math: batch and positions are explicit; KV storage is handed in by the caller (runtime), so
the same modules serve the plain eager path, batched decode and CUDA graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dual_ar_config import DualARConfig
from .layers import RMSNorm, apply_rope, rope_table

try:  # the compiled decode step's attention kernel
    from . import decode_attention as attention_kernel
except ImportError:  # no Triton (or a broken one, as engine.compilation treats it; or torch < 2.6, no triton_op):
    attention_kernel = None  # the step writes attention in PyTorch ops
try:  # the compiled decode step's projections, each fused with its norm, gate or residual
    from . import fused_linear as projection_kernel
except ImportError:  # as above: the step keeps Inductor's (or cuBLAS's) matmuls
    projection_kernel = None

@dataclass
class KVView:
    """Where one attention layer stores and reads keys/values for this call.

    k, v: (B, n_kv_heads, capacity, head_dim) storage, one row per batch entry (slot b serves row b);
    positions: (B, S) positions written by this call; key_positions: arange(kv_len), the leading
    positions read (every live position of every row lies below kv_len), a tensor rather than an int
    so that a compiled step sees kv_len as a dynamic size; mask: (B, 1, S, kv_len) bool, key j visible
    to query s (built once per call and shared by every layer), or None when every key read is
    visible (the fast transformer, which reads exactly positions 0..k at position k).
    """

    k: Tensor
    v: Tensor
    positions: Tensor
    key_positions: Tensor
    mask: Tensor | None


def one_query_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """Scaled dot-product attention for decoding, written out so that Inductor fuses it into a few
    small reductions (a general fused-attention kernel spends most of its time on tiles that one
    query per head leaves empty). q (B, H, G, D) with G query rows per head, keys and values
    (B, H, L, D), mask (B, 1, G, L) bool (True = visible) or None. Computed in fp32."""
    scores = (q.unsqueeze(3).float() * keys.unsqueeze(2).float()).sum(-1) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1)
    if mask is None:  # the fast transformer's few keys (all visible): one small fused reduction
        return (probs.unsqueeze(-1) * values.unsqueeze(2).float()).sum(dim=-2).to(q.dtype)
    # Hundreds of keys: as a matmul, which reads V whole rows at a time (a fused reduction over the
    # keys reads V down its columns; the matmul is also faster than SDPA here).
    return torch.matmul(probs.to(values.dtype), values)


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, n_kv_heads: int, head_dim: int, eps: float,
                 qk_norm: bool, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.n_head, self.n_kv_heads, self.head_dim = n_head, n_kv_heads, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv_heads) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        else:
            self.q_norm = self.k_norm = None
        self.decode_kernel = False  # set by use_decode_kernel()

    def use_decode_kernel(self) -> bool:
        """Let compiled calls of one new token per row (the decode step) run the rest of attend()
        as one decode_attention kernel, which writes the KV cache itself, if Triton is there and
        the heads suit it. Returns whether it will.

        For compiled regions that get the layer's KV views as inputs, with K and V in tensors of
        their own, as the step runner's blocks do: a custom op that writes its inputs made Inductor
        (torch 2.11) copy the whole cache when the views were taken inside the compiled code (and
        then crash at full size), and give wrong results when K and V viewed one tensor."""
        self.decode_kernel = attention_kernel is not None and attention_kernel.supports(self.head_dim)
        return self.decode_kernel

    def kernel_norms(self) -> tuple[Tensor | None, Tensor | None, float]:
        """decode_attention's norm operands: (q_norm weight, k_norm weight, eps), all None/0 without q/k norms."""
        if self.q_norm is None:
            return None, None, 0.0
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps

    def forward(self, x: Tensor, rope: Tensor, kv: KVView) -> Tensor:
        return self.wo(self.attend(self.wqkv(x), rope, kv))

    def attend(self, qkv: Tensor, rope: Tensor, kv: KVView) -> Tensor:
        """qkv (B, S, (H + 2 H_kv) D) projected inputs -> (B, S, H D) attended values, before wo."""
        bsz, seqlen, _ = qkv.shape
        if seqlen == 1 and self.decode_kernel and qkv.is_cuda and torch.compiler.is_compiling():
            # The compiled decode step: norms, RoPE, the KV write and attention over each row's own
            # live keys (positions 0..p) in one kernel instead of five to seven.
            op = attention_kernel.decode_attention_one_row if bsz == 1 else attention_kernel.decode_attention
            out = op(qkv.reshape(bsz, -1), *self.kernel_norms(), rope.reshape(bsz, -1), kv.k, kv.v, kv.positions[:, 0],
                     kv.key_positions.shape[0], self.n_head)
            return out.view(bsz, 1, -1)
        q_size, kv_size = self.n_head * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(bsz, seqlen, self.n_head, self.head_dim)
        k = k.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, rope), apply_rope(k, rope)

        # Advanced indices on dims 0 and 2 put (B, S) first: the value is (B, S, H_kv, D).
        batch_rows = torch.arange(bsz, device=qkv.device)[:, None]
        kv.k[batch_rows, :, kv.positions] = k
        kv.v[batch_rows, :, kv.positions] = v
        kv_len = kv.key_positions.shape[0]
        keys, values = kv.k[:, :, :kv_len], kv.v[:, :, :kv_len]

        # Grouped queries without expanding K/V: query heads g*G .. g*G+G-1 share KV head g, so
        # (B, H, S, D) is viewed as (B, H_kv, G*S, D) and the mask repeated G times.
        group = self.n_head // self.n_kv_heads
        q = q.transpose(1, 2).reshape(bsz, self.n_kv_heads, group * seqlen, self.head_dim)
        mask = kv.mask
        if mask is not None:
            mask = mask.expand(bsz, group, seqlen, kv_len).reshape(bsz, 1, group * seqlen, kv_len)
        if seqlen == 1 and torch.compiler.is_compiling():  # compiled without the kernel (no Triton, or its head size)
            out = one_query_attention(q, keys, values, mask)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        out = out.reshape(bsz, self.n_head, seqlen, self.head_dim).transpose(1, 2)
        return out.reshape(bsz, seqlen, q_size)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.register_buffer("w13", None, persistent=False)

    def fuse_gate_up(self, as_linear: bool = False) -> None:
        """One (2*hidden, dim) matrix for w1 and w3 (one matmul instead of two); w1 and w3 become
        views of it, so the state dict and memory stay as they are.

        as_linear: the matrix becomes a Linear `w13` that replaces w1 and w3 (the state dict then
        holds w13): the layout quantization needs, as torchao converts the weights of Linear modules.
        """
        w13 = self.w13 if self.w13 is not None else torch.cat([self.w1.weight, self.w3.weight])
        if as_linear:
            del self.w1, self.w3, self.w13
            self.w13 = nn.Linear(w13.shape[1], w13.shape[0], bias=False, device="meta")
            self.w13.weight = nn.Parameter(w13, requires_grad=False)
            return
        hidden = self.w1.weight.shape[0]
        self.w1.weight = nn.Parameter(w13[:hidden], requires_grad=False)
        self.w3.weight = nn.Parameter(w13[hidden:], requires_grad=False)
        self.w13 = w13

    def forward(self, x: Tensor) -> Tensor:
        if self.w13 is None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        gate_up = self.w13(x) if isinstance(self.w13, nn.Linear) else F.linear(x, self.w13)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


def _plain(weight) -> bool:
    """Whether fused_linear can read this weight as it is: a plain tensor (torchao's quantized
    weights are tensor subclasses, and a weight that was never built is None)."""
    return type(weight) in (Tensor, nn.Parameter)


def _kernel_operands(weight) -> tuple[Tensor, Tensor | None] | None:
    """(weight, row scales or None) as fused_linear reads them, or None if it cannot: a plain
    weight, or torchao's Int8Tensor with one scale per row and no zero point (--quantize int8)."""
    if _plain(weight):
        return weight, None
    if type(weight).__name__ != "Int8Tensor" or getattr(weight, "act_quant_kwargs", None) is not None \
            or getattr(weight, "act_pre_scale", None) is not None:  # the kernel scales no activations
        return None
    qdata, scale, zero_point = weight.qdata, weight.scale, getattr(weight, "zero_point", None)
    if qdata.dtype != torch.int8 or scale.numel() != qdata.shape[0] or \
            (zero_point is not None and bool(zero_point.any())):  # set-up only: one sync per weight
        return None
    return qdata, scale.reshape(-1)


class Block(nn.Module):
    def __init__(self, dim, n_head, n_kv_heads, head_dim, hidden, eps, qk_norm, qkv_bias, o_bias):
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv_heads, head_dim, eps, qk_norm, qkv_bias, o_bias)
        self.feed_forward = FeedForward(dim, hidden)
        # Registration order matches the released state dict.
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_norm = RMSNorm(dim, eps)
        self.fused_projections = False  # set by use_fused_projections()
        self._projection_operands = None  # ((weight, row scales or None) x 4), with fused_projections
        self.weight_evictions = ("", "", "", "")  # the four projections' L2 hints, with fused_projections

    def use_fused_projections(self, weight_evictions: tuple[str, ...] = ("", "", "", "")) -> bool:
        """Let the compiled batch-1 decode step (one row, one position) run this block's four
        projections as fused_linear kernels, if Triton is there and the weights are ones it reads
        (plain, or int8 with row scales) without biases; other quantized weights keep their own
        kernels. weight_evictions: the L2 cache hints of the qkv, wo, w13 and w2 weight loads (see
        DualARTransformer.weight_cache_hints). Returns whether it will."""
        a, f = self.attention, self.feed_forward
        w13 = f.w13.weight if isinstance(f.w13, nn.Linear) else f.w13  # (None when not fused)
        operands = [_kernel_operands(w) for w in (a.wqkv.weight, a.wo.weight, w13, f.w2.weight)]
        activation_dtype = self.attention_norm.weight.dtype
        self.fused_projections = (
            projection_kernel is not None and a.wqkv.bias is None and a.wo.bias is None
            and None not in operands
            and all(w.dtype == activation_dtype for w, scale in operands if scale is None))
        self._projection_operands = operands if self.fused_projections else None
        self.weight_evictions = weight_evictions
        return self.fused_projections

    def forward(self, x: Tensor, rope: Tensor, kv: KVView, kv_only: bool = False) -> Tensor | None:
        """The block's output; with kv_only, only its keys and values are stored (the caller reads
        nothing else of this call) and None is returned."""
        fused = self.fused_projections and x.shape[0] == x.shape[1] == 1 and x.is_cuda and torch.compiler.is_compiling()
        if kv_only:  # attend() stores them; its output is dropped (the decode kernel writes as it attends)
            self.attention.attend(self._qkv(x, fused), rope, kv)
            return None
        if fused:
            return self._decode_fused(x, rope, kv)
        h = x + self.attention(self.attention_norm(x), rope, kv)
        return h + self.feed_forward(self.ffn_norm(h))

    def _qkv(self, x: Tensor, fused: bool) -> Tensor:
        """attention_norm then wqkv: x (B, S, dim) -> (B, S, qkv width); fused: one fused_linear kernel."""
        norm = self.attention_norm
        if not fused:
            return self.attention.wqkv(norm(x))
        wqkv, qkv_scale = self._projection_operands[0]
        qkv = projection_kernel.fused_linear(x.reshape(1, x.shape[-1]), wqkv, qkv_scale, norm.weight, None, norm.eps,
                                             False, self.weight_evictions[0])
        return qkv.view(1, 1, -1)

    def _decode_fused(self, x: Tensor, rope: Tensor, kv: KVView) -> Tensor:
        """forward() in four fused_linear kernels plus attention: the norms go into the
        projections after them, the residual adds and the SiLU gate into the ones before."""
        linear = projection_kernel.fused_linear
        _, (wo, wo_scale), (w13, w13_scale), (w2, w2_scale) = self._projection_operands
        _, wo_hint, w13_hint, w2_hint = self.weight_evictions
        row = x.reshape(1, x.shape[-1])
        attended = self.attention.attend(self._qkv(x, True), rope, kv)
        h = linear(attended.reshape(1, -1), wo, wo_scale, None, row, 0.0, False, wo_hint)
        gated = linear(h, w13, w13_scale, self.ffn_norm.weight, None, self.ffn_norm.eps, True, w13_hint)
        return linear(gated, w2, w2_scale, None, h, 0.0, False, w2_hint).view_as(x)


def call_block(layer: Block, x: Tensor, rope: Tensor, kv: KVView, kv_only: bool = False) -> Tensor | None:
    return layer(x, rope, kv, kv_only)


def embed_and_rotation(model: "DualARTransformer", columns: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """The slow transformer's inputs: the embeddings of columns (B, 1 + num_codebooks, S) and the
    rotations at positions (B, S)."""
    return model.embed(columns), model.rope_slow[positions]


def norm_then_linear(norm: RMSNorm, weight: Tensor, x: Tensor) -> Tensor:
    """An output head: logits = norm(x) @ weight^T."""
    return F.linear(norm(x), weight)


def fused_norm_then_linear(norm: RMSNorm, weight: Tensor, x: Tensor, otherwise=norm_then_linear) -> Tensor:
    """norm_then_linear as one fused_linear kernel for a lone row (the step's heads run between its
    compiled regions, where the norm alone is seven eager kernels); other inputs go to `otherwise`
    (a compiled norm_then_linear in the compiled step)."""
    if projection_kernel is None or x.numel() != x.shape[-1] or not x.is_cuda \
            or not _plain(weight) or weight.dtype != x.dtype:
        return otherwise(norm, weight, x)
    logits = projection_kernel.fused_linear(x.reshape(1, -1), weight, None, norm.weight, None, norm.eps, False)
    return logits.view(*x.shape[:-1], -1)


@dataclass(frozen=True)
class TokenLayout:
    """Where the semantic tokens sit in the vocabulary (from the tokenizer), and the code ranges."""

    semantic_begin_id: int
    semantic_end_id: int
    im_end_id: int
    residual_codebook_size: int = 1024  # codes 1..9 are sampled from this many fast logits


class DualARTransformer(nn.Module):
    """Slow (per frame) + fast (per codebook) transformers with the released state-dict layout."""

    def __init__(self, config: DualARConfig, layout: TokenLayout):
        super().__init__()
        c = self.config = config
        self.layout = layout
        self.embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.codebook_embeddings = nn.Embedding(c.codebook_size * c.num_codebooks, c.dim)
        self.layers = nn.ModuleList(
            Block(c.dim, c.n_head, c.n_local_heads, c.head_dim, c.intermediate_size, c.norm_eps,
                  c.attention_qk_norm, c.attention_qkv_bias, c.attention_o_bias)
            for _ in range(c.n_layer)
        )
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)

        self.fast_embeddings = nn.Embedding(c.codebook_size, c.fast_dim)
        self.fast_layers = nn.ModuleList(
            Block(c.fast_dim, c.fast_n_head, c.fast_n_local_heads, c.fast_head_dim, c.fast_intermediate_size,
                  c.norm_eps, c.fast_attention_qk_norm, c.fast_attention_qkv_bias, c.fast_attention_o_bias)
            for _ in range(c.n_fast_layer)
        )
        self.fast_norm = RMSNorm(c.fast_dim, c.norm_eps)
        self.fast_output = nn.Linear(c.fast_dim, c.codebook_size, bias=False)

        self.reset_buffers()

    def fuse_(self, as_linear: bool = False) -> "DualARTransformer":
        """Inference-time weight layout (after loading): fused gate/up projections (as_linear: see
        FeedForward.fuse_gate_up)."""
        for layer in [*self.layers, *self.fast_layers]:
            layer.feed_forward.fuse_gate_up(as_linear)
        return self

    def use_fused_projections(self) -> bool:
        """See Block.use_fused_projections; True if every block will. Their weight loads then carry
        L2 cache hints (weight_cache_hints)."""
        slow, fast = self.weight_cache_hints()
        return all([layer.use_fused_projections(hints)
                    for layers, hints in ((self.layers, slow), (self.fast_layers, fast)) for layer in layers])

    @staticmethod
    def weight_cache_hints() -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The L2 hints of the slow and the fast blocks' projections (qkv, wo, w13, w2) at batch 1. A
        frame streams ~0.9 GB of slow weights once and the fast blocks' ~0.1 GB ten times, through an
        L2 of tens of MB: the slow weights and the fast QKV and gate/up go first, so that the fast
        output and down projections (~33 MB) stay cached from one fast position to the next."""
        return ("evict_first",) * 4, ("evict_first", "evict_last", "evict_first", "evict_last")

    def use_decode_kernels(self) -> bool:
        """See Attention.use_decode_kernel; True if every layer will."""
        return all([layer.attention.use_decode_kernel() for layer in [*self.layers, *self.fast_layers]])

    def reset_buffers(self, device: torch.device | str | None = None) -> None:
        """Build the tensors that are not in model.pth (after a meta-device load, on the real device)."""
        c = self.config
        # bf16-rounded RoPE tables, exactly as the reference builds them, whatever the run dtype.
        self.register_buffer("rope_slow", rope_table(c.max_seq_len, c.head_dim, c.rope_base).to(device), persistent=False)
        self.register_buffer("rope_fast", rope_table(c.num_codebooks, c.fast_head_dim, c.rope_base).to(device), persistent=False)
        offsets = torch.arange(c.num_codebooks, device=device) * c.codebook_size
        self.register_buffer("codebook_offsets", offsets, persistent=False)

    # ---- slow transformer -------------------------------------------------------------------

    def embed(self, columns: Tensor) -> Tensor:
        """columns: (B, 1 + num_codebooks, S) ints -> (B, S, dim) input embeddings (inference path)."""
        tokens, codes = columns[:, 0], columns[:, 1:]
        vq = self.codebook_embeddings(codes + self.codebook_offsets[None, :, None]).sum(dim=1)
        is_semantic = (tokens >= self.layout.semantic_begin_id) & (tokens <= self.layout.semantic_end_id)
        vq = vq * is_semantic.unsqueeze(-1).to(vq.dtype)
        x = self.embeddings(tokens) + vq
        if self.config.scale_codebook_embeddings:
            x = torch.where(is_semantic.unsqueeze(-1), x / math.sqrt(self.config.num_codebooks + 1), x)
        return x

    def forward_slow(self, columns: Tensor, kv_views: list[KVView], run_block=None, run_embed=None) -> Tensor:
        """Run the slow layers; returns the residual stream after the last layer (before `norm`).

        run_block(layer, x, rope, kv) replaces a plain layer call (e.g. by a compiled one), and
        run_embed(model, columns, positions) the input embeddings and rotations (embed_and_rotation).
        """
        run_block = run_block or call_block
        x, rope = (run_embed or embed_and_rotation)(self, columns, kv_views[0].positions)
        for layer, kv in zip(self.layers, kv_views, strict=True):
            x = run_block(layer, x, rope, kv)
        return x

    def slow_logits(self, hidden: Tensor) -> Tensor:
        if self.output is None:
            raise RuntimeError("this model's vocabulary-wide output matrix was released (the engine samples codebook 0 "
                               "from the semantic rows only); load it with exact_sampling=True to read every logit")
        return self.output(self.norm(hidden))

    def release_output_(self) -> None:
        """Free the vocabulary-wide output matrix, for a runtime that copied the rows it samples from."""
        self.output = None

    # ---- fast transformer -------------------------------------------------------------------

    def forward_fast(self, x: Tensor, kv_views: list[KVView], n_logits: int | None = None,
                     run_block=None, run_head=norm_then_linear, rope: Tensor | None = None) -> Tensor | None:
        """One fast position for every row. x: (B, 1, fast_dim) -> logits (B, 1, n_logits).

        n_logits: the leading output columns wanted (None: all codebook_size; 0: none, the call only
        fills the fast KV cache). Fewer columns read fewer weight rows and give identical values.
        rope: the rotation at the views' positions, if the caller has it (else looked up here).
        """
        run_block = run_block or call_block
        if rope is None:
            rope = self.rope_fast[kv_views[0].positions]
        *inner, (last, last_kv) = zip(self.fast_layers, kv_views, strict=True)
        for layer, kv in inner:
            x = run_block(layer, x, rope, kv)
        if n_logits == 0:  # of the last layer, only the keys and values are ever read (by later positions)
            run_block(last, x, rope, last_kv, True)
            return None
        x = run_block(last, x, rope, last_kv)
        return run_head(self.fast_norm, self.fast_output.weight[:n_logits], x)
