"""The codec's window-limited causal transformer: its layers, and `layer_forward`, the one function
that computes a layer (a whole sequence, or a chunk after cached keys and values)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import sdpa_kernel

from .codec_config import TransformerConfig
from .layers import PLAN_FREE_ATTENTION, RMSNorm, apply_rope, rms_norm, rope_table


def window_mask(seq_len: int, window: int, device) -> Tensor:
    """(T, T) bool, True where query i may attend key j: i - window < j <= i."""
    i = torch.arange(seq_len, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.empty(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim = cfg.n_head, cfg.n_local_heads, cfg.head_dim
        qkv = (cfg.n_head + 2 * cfg.n_local_heads) * cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, qkv, bias=False)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.dim, bias=False)


class FeedForward(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)


class TransformerLayer(nn.Module):
    """Attention and FeedForward hold the parameters; the layer's computation is layer_forward, which
    the streaming decoders share (engine/model/codec_stream.py)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        # Registration order = the checkpoint's key order.
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention_layer_scale = LayerScale(cfg.dim) if cfg.layer_scale else nn.Identity()
        self.ffn_layer_scale = LayerScale(cfg.dim) if cfg.layer_scale else nn.Identity()

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor) -> Tensor:
        return layer_forward(x, rope, mask, None, None, layer_weights(self))[0]


@dataclass(frozen=True)
class LayerWeights:
    """A TransformerLayer's parameters, as layer_forward takes them."""

    attention_norm: Tensor
    wqkv: Tensor
    wo: Tensor
    attention_scale: Tensor | None  # LayerScale's gamma, None without layer scale
    ffn_norm: Tensor
    w1: Tensor
    w3: Tensor
    w2: Tensor
    ffn_scale: Tensor | None
    eps: float


def layer_weights(layer: TransformerLayer) -> LayerWeights:
    """The layer's parameters as layer_forward takes them (a streamer takes them once, when it is
    built: do not swap the codec's parameters afterwards). A layer made of other parts than
    layer_forward computes is an error, as any unknown module is in codec_stream."""
    att, ffn = layer.attention, layer.feed_forward

    def scale(m: nn.Module) -> Tensor | None:
        return m.gamma if isinstance(m, LayerScale) else None

    scales_known = all(isinstance(m, (LayerScale, nn.Identity))
                       for m in (layer.attention_layer_scale, layer.ffn_layer_scale))
    norms_known = all(type(m) is RMSNorm for m in (layer.attention_norm, layer.ffn_norm))
    unbiased = all(getattr(m, "bias", None) is None for m in (att.wqkv, att.wo, ffn.w1, ffn.w2, ffn.w3))
    if not (scales_known and norms_known and unbiased) or layer.attention_norm.eps != layer.ffn_norm.eps:
        raise TypeError("a codec transformer layer is expected to have RMSNorms of one eps, unbiased projections and "
                        "LayerScale or no layer scale: the codec's architecture changed")
    return LayerWeights(layer.attention_norm.weight, att.wqkv.weight, att.wo.weight, scale(layer.attention_layer_scale),
                        layer.ffn_norm.weight, ffn.w1.weight, ffn.w3.weight, ffn.w2.weight, scale(layer.ffn_layer_scale),
                        layer.attention_norm.eps)


def layer_forward(h: Tensor, rope: Tensor, mask: Tensor, k_cached: Tensor | None, v_cached: Tensor | None,
                  w: LayerWeights) -> tuple[Tensor, Tensor, Tensor]:
    """A TransformerLayer on h (b, n, dim), its parameters `w`: the layer of a whole sequence (caches
    None), or of a streamed chunk whose queries also attend the cached keys and values (b, kv heads,
    window - 1, head dim) before it (codec_stream). Returns (h after the layer, the last window - 1
    keys, and values): a streamed chunk's caches for the next one. A function of tensors alone, so
    that one torch.compile of it serves every layer (codec_stream.compiled_layer_forward). Callers
    choose the attention backends around it (PLAN_FREE_ATTENTION: the codec's graphs run a shape per
    row count and chunk length, for each of which cuDNN attention would build a plan at every start;
    inside a compiled function the choice would keep its graphs out of the compiled regions' store)."""
    # The head layout from shapes that stay static under torch.compile (the parameters', and the
    # rope table's (..., head_dim / 2, 2)), not from ints: transformers of other layouts calling one
    # compiled function would turn such ints into symbols.
    head_dim, (B, n, _) = 2 * rope.shape[-2], h.shape
    n_head = w.wo.shape[1] // head_dim
    kv = (w.wqkv.shape[0] - w.wo.shape[1]) // 2
    n_local_heads = kv // head_dim
    q, k, v = F.linear(rms_norm(h, w.attention_norm, w.eps), w.wqkv).split([n_head * head_dim, kv, kv], dim=-1)
    q = apply_rope(q.view(B, n, n_head, head_dim), rope).transpose(1, 2)
    k = apply_rope(k.view(B, n, n_local_heads, head_dim), rope).transpose(1, 2)
    v = v.view(B, n, n_local_heads, head_dim).transpose(1, 2)
    if k_cached is not None:
        k = torch.cat([k_cached.to(k.dtype), k], 2)
        v = torch.cat([v_cached.to(v.dtype), v], 2)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=n_head != n_local_heads)
    a = F.linear(y.transpose(1, 2).reshape(B, n, -1), w.wo)
    h = h + (a if w.attention_scale is None else a * w.attention_scale)
    x = rms_norm(h, w.ffn_norm, w.eps)
    f = F.linear(F.silu(F.linear(x, w.w1)) * F.linear(x, w.w3), w.w2)
    return h + (f if w.ffn_scale is None else f * w.ffn_scale), k[:, :, n:], v[:, :, n:]


class WindowLimitedTransformer(nn.Module):
    """Causal transformer on (B, C, T), each query seeing the last `window_size` positions.

    Positions restart at 0 on every call. `freqs_cis` (bf16 RoPE table) and `causal_mask` are
    persisted in codec.pth; attention builds its window mask per call instead of slicing the stored
    one, so `causal_mask` only serves strict loading (load_codec drops it afterwards).
    """

    def __init__(self, cfg: TransformerConfig, n_layer: int):
        super().__init__()
        self.window_size, self.block_size = cfg.window_size, cfg.block_size
        self.register_buffer("freqs_cis", rope_table(cfg.block_size, cfg.head_dim, cfg.rope_base, negative_power=True))
        mask = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", mask)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.stream_layer = None  # how streamed decoders run a layer (stream_layers_with); None: as written

    def stream_layers_with(self, layer_forward) -> None:
        """Run this transformer's layers with `layer_forward` (codec_stream.layer_forward, compiled) in
        the streaming decoders built after this call."""
        self.stream_layer = layer_forward

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[-1]
        if T > self.block_size:
            raise ValueError(
                f"{T} frames in one codec transformer call; at most {self.block_size} fit its RoPE table: "
                "split the input into shorter chunks"
            )
        rope = self.freqs_cis[:T].float()
        mask = window_mask(T, self.window_size, x.device)
        x = x.transpose(1, 2)
        with sdpa_kernel(PLAN_FREE_ATTENTION):
            for layer in self.layers:
                x = layer(x, rope, mask)
        return self.norm(x).transpose(1, 2)
