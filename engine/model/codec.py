"""Modded-DAC codec of OpenAudio S1-mini: codes (B, 10, T) <-> 44.1 kHz audio (B, 1, 2048 T).

Module and parameter names mirror the keys of the released `codec.pth`, so it loads strictly:
  encoder                       causal conv stack, window-limited transformer in its last block
  quantizer.downsample          2 x (plain causal conv k2 s2 + ConvNeXt): x1/4 in time
  quantizer.pre_module          window-limited transformer, the VQ input
  quantizer.semantic_quantizer  1 cosine VQ (4096 entries)
  quantizer.quantizer           9 residual cosine VQs (1024 entries)
  quantizer.post_module         window-limited transformer on the summed codebook vectors
  quantizer.upsample            2 x (plain causal transposed conv k2 s2 + ConvNeXt): x4 in time
  decoder                       causal transposed-conv stack, tanh
Every conv is causal (left padding only), so the codec is ready for chunked streaming decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import CheckpointError
from .codec_config import CodecConfig, ConvNeXtConfig, TransformerConfig
from .layers import RMSNorm, apply_rope, rms_norm, rope_table

__all__ = ["CodecConfig", "ModdedDAC", "load_codec", "random_codec"]


# --------------------------------------------------------------------------------------------------
# Convolutions


def weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """g * v / ||v||, the norm over every dim but 0 (for a transposed conv, dim 0 is the input)."""
    g, v = g.float(), v.float()
    return v * (g / v.norm(dim=tuple(range(1, v.dim())), keepdim=True))


class _GV(nn.Module):
    """g and v under the names torch's weight_norm parametrization saves them with."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.original0 = nn.Parameter(torch.empty(shape[0], 1, 1))  # g
        self.original1 = nn.Parameter(torch.empty(shape))  # v


class WNConv(nn.Module):
    """Conv1d / ConvTranspose1d (no padding) with a weight-normed weight.

    legacy=False keeps g, v as `parametrizations.weight.original0/1` (the codec's convs); legacy=True
    as `weight_g` / `weight_v` (the VQ projections, from the old torch.nn.utils.weight_norm).
    `fused()` returns the equivalent plain conv, so inference does not recompute g v / |v|.
    """

    def __init__(self, c_in, c_out, kernel_size, stride=1, dilation=1, transpose=False, legacy=False):
        super().__init__()
        shape = (c_in, c_out, kernel_size) if transpose else (c_out, c_in, kernel_size)
        self.stride, self.dilation, self.transpose, self.legacy = stride, dilation, transpose, legacy
        self.bias = nn.Parameter(torch.empty(c_out))
        if legacy:
            self.weight_g = nn.Parameter(torch.empty(shape[0], 1, 1))
            self.weight_v = nn.Parameter(torch.empty(shape))
        else:
            self.parametrizations = nn.ModuleDict({"weight": _GV(shape)})

    @property
    def g_v(self) -> tuple[Tensor, Tensor]:
        if self.legacy:
            return self.weight_g, self.weight_v
        gv = self.parametrizations["weight"]
        return gv.original0, gv.original1

    def forward(self, x: Tensor) -> Tensor:
        w = weight_norm(*self.g_v).to(x.dtype)
        if self.transpose:
            return F.conv_transpose1d(x, w, self.bias, self.stride)
        return F.conv1d(x, w, self.bias, self.stride, dilation=self.dilation)

    def fused(self) -> nn.Conv1d | nn.ConvTranspose1d:
        g, v = self.g_v
        cls = nn.ConvTranspose1d if self.transpose else nn.Conv1d
        c_in, c_out = (v.shape[0], v.shape[1]) if self.transpose else (v.shape[1], v.shape[0])
        conv = cls(c_in, c_out, v.shape[2], stride=self.stride, dilation=self.dilation, device="meta")
        conv.weight = nn.Parameter(weight_norm(g, v).to(v.dtype), requires_grad=v.requires_grad)
        conv.bias = self.bias
        return conv


class CausalConv1d(nn.Module):
    """Left-pad k_eff - stride, right-pad to a whole number of strides: output length ceil(n / stride)."""

    def __init__(self, c_in, c_out, kernel_size, stride=1, dilation=1, groups=1, wn=True):
        super().__init__()
        if wn:
            self.conv = WNConv(c_in, c_out, kernel_size, stride, dilation)
        else:
            self.conv = nn.Conv1d(c_in, c_out, kernel_size, stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.left_pad = (kernel_size - 1) * dilation + 1 - stride

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.left_pad, -x.shape[-1] % self.stride)))


class CausalConvTranspose1d(nn.Module):
    """Transposed conv, then trim kernel_size - stride samples on the right: output length n * stride."""

    def __init__(self, c_in, c_out, kernel_size, stride, wn=True):
        super().__init__()
        if wn:
            self.conv = WNConv(c_in, c_out, kernel_size, stride, transpose=True)
        else:
            self.conv = nn.ConvTranspose1d(c_in, c_out, kernel_size, stride)
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)[..., : x.shape[-1] * self.stride]


def snake(x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """x + sin(alpha x)^2 / alpha, per channel. Eagerly five passes over x; compiled, one kernel."""
    return x + (alpha + eps).reciprocal() * torch.sin(alpha * x).pow(2)


class Snake1d(nn.Module):
    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(1, channels, 1))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return snake(x, self.alpha, self.eps)


def context_snake(context: Tensor, x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """cat(context, snake(x)) in time: the input of a streamed causal conv after a Snake."""
    return torch.cat([context.to(x.dtype), snake(x, alpha, eps)], -1)


def biased_snake(x: Tensor, bias: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """snake(x + bias): a conv's bias added after the conv, with the Snake that follows it."""
    return snake(x + bias[:, None], alpha, eps)


def biased_residual(x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
    """x + (y + bias): a residual unit's output from its last conv without that conv's bias."""
    return x + (y + bias[:, None])


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, snake_eps: float):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim, snake_eps),
            CausalConv1d(dim, dim, 7, dilation=dilation),
            Snake1d(dim, snake_eps),
            CausalConv1d(dim, dim, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv, LayerNorm, pointwise MLP (GELU), layer scale, residual."""

    def __init__(self, cfg: ConvNeXtConfig):
        super().__init__()
        dim = cfg.dim
        self.gamma = nn.Parameter(torch.empty(dim))
        self.dwconv = CausalConv1d(dim, dim, cfg.kernel_size, groups=dim, wn=False)
        self.norm = nn.LayerNorm(dim, eps=cfg.layernorm_eps)
        self.pwconv1 = nn.Linear(dim, cfg.mlp_ratio * dim)
        self.pwconv2 = nn.Linear(cfg.mlp_ratio * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.dwconv(x).transpose(1, 2))
        y = self.pwconv2(F.gelu(self.pwconv1(y)))
        return x + (self.gamma * y).transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# Window-limited transformer


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
    heads: tuple[int, int, int]  # query heads, key/value heads, head dim
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
                        (att.n_head, att.n_local_heads, att.head_dim), layer.attention_norm.eps)


def layer_forward(h: Tensor, rope: Tensor, mask: Tensor, k_cached: Tensor | None, v_cached: Tensor | None,
                  w: LayerWeights) -> tuple[Tensor, Tensor, Tensor]:
    """A TransformerLayer on h (b, n, dim), its parameters `w`: the layer of a whole sequence (caches
    None), or of a streamed chunk whose queries also attend the cached keys and values (b, kv heads,
    window - 1, head dim) before it (codec_stream). Returns (h after the layer, the last window - 1
    keys, and values): a streamed chunk's caches for the next one. A function of tensors alone, so
    that one torch.compile of it serves every layer (codec_stream.compiled_layer_forward)."""
    (n_head, n_local_heads, head_dim), (B, n, _) = w.heads, h.shape
    kv = n_local_heads * head_dim
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
        for layer in self.layers:
            x = layer(x, rope, mask)
        return self.norm(x).transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# Encoder, quantizer, decoder


class EncoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, cfg: CodecConfig, n_transformer_layers: int):
        super().__init__()
        layers = [ResidualUnit(c_in, d, cfg.snake_eps) for d in (1, 3, 9)]
        layers += [Snake1d(c_in, cfg.snake_eps), CausalConv1d(c_in, c_out, 2 * stride, stride)]
        if n_transformer_layers:
            layers.append(WindowLimitedTransformer(cfg.encoder_transformer, n_transformer_layers))
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Encoder(nn.Module):
    """(B, 1, n) audio -> (B, latent_dim, n / hop_length)."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        dims = (cfg.encoder_dim, *cfg.encoder_block_dims)
        layers = [CausalConv1d(1, cfg.encoder_dim, 7)]
        for i, stride in enumerate(cfg.encoder_rates):
            n_layer = cfg.encoder_transformer.layers_per_block[i]
            layers.append(EncoderBlock(dims[i], dims[i + 1], stride, cfg, n_layer))
        layers += [Snake1d(dims[-1], cfg.snake_eps), CausalConv1d(dims[-1], cfg.latent_dim, 3)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class VectorQuantize(nn.Module):
    """Factorised VQ: project to codebook_dim, pick the entry of highest cosine, project back."""

    def __init__(self, dim: int, codebook_size: int, codebook_dim: int):
        super().__init__()
        self.in_proj = WNConv(dim, codebook_dim, 1, legacy=True)
        self.out_proj = WNConv(codebook_dim, dim, 1, legacy=True)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """z (B, C, T) -> (out_proj of the chosen entries (B, C, T), codes (B, T))."""
        z_e = self.in_proj(z)
        # Distances between L2-normalised vectors, written as the reference writes them so that
        # near-ties resolve the same way; fp32 whatever the model dtype.
        e = F.normalize(z_e.transpose(1, 2).reshape(-1, z_e.shape[1]).float())
        c = F.normalize(self.codebook.weight.float())
        dist = e.pow(2).sum(1, keepdim=True) - 2 * e @ c.t() + c.pow(2).sum(1, keepdim=True).t()
        codes = (-dist).argmax(1).view(z.shape[0], -1)
        c_raw = self.codebook(codes).transpose(1, 2)
        # The reference's straight-through form: can differ from c_raw by an ulp, and the residual
        # of the next stage is computed from it.
        return self.out_proj(z_e + (c_raw - z_e)), codes

    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, T) -> (B, C, T)."""
        return self.out_proj(self.codebook(codes).transpose(1, 2))


class ResidualVQ(nn.Module):
    def __init__(self, n: int, dim: int, codebook_size: int, codebook_dim: int):
        super().__init__()
        self.quantizers = nn.ModuleList(VectorQuantize(dim, codebook_size, codebook_dim) for _ in range(n))

    def quantize(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Each stage quantises what the earlier ones left: (sum of stage outputs, codes (B, n, T))."""
        z_q, residual, codes = 0, z, []
        for q in self.quantizers:
            z_i, c = q.quantize(residual)
            z_q, residual = z_q + z_i, residual - z_i
            codes.append(c)
        return z_q, torch.stack(codes, 1)

    def decode(self, codes: Tensor) -> Tensor:
        z = 0
        for i, q in enumerate(self.quantizers):
            z = z + q.decode(codes[:, i])
        return z


class Quantizer(nn.Module):
    """Encoder latents (4T frames) <-> codes (T frames): resampling, transformers and the VQs."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        d, qt = cfg.latent_dim, cfg.quantizer_transformer
        self.semantic_codebook_size = cfg.semantic_codebook_size
        self.residual_codebook_size = cfg.residual_codebook_size
        self.semantic_quantizer = ResidualVQ(1, d, cfg.semantic_codebook_size, cfg.codebook_dim)
        self.quantizer = ResidualVQ(cfg.n_residual_codebooks, d, cfg.residual_codebook_size, cfg.codebook_dim)
        self.downsample = nn.Sequential(
            *(nn.Sequential(CausalConv1d(d, d, f, f, wn=False), ConvNeXtBlock(cfg.convnext))
              for f in cfg.downsample_factor)
        )
        self.upsample = nn.Sequential(
            *(nn.Sequential(CausalConvTranspose1d(d, d, f, f, wn=False), ConvNeXtBlock(cfg.convnext))
              for f in reversed(cfg.downsample_factor))
        )
        self.pre_module = WindowLimitedTransformer(qt, qt.n_layer)
        self.post_module = WindowLimitedTransformer(qt, qt.n_layer)

    def encode(self, z: Tensor) -> Tensor:
        """(B, latent_dim, 4T) -> codes (B, 1 + n_residual, T)."""
        return self.quantize_latent(self.pre_module(self.downsample(z)))

    def quantize_latent(self, z: Tensor) -> Tensor:
        """(B, latent_dim, T) pre_module output -> codes: the semantic VQ, then the residual VQs in
        sequence on what it leaves. Frame by frame: no state across frames."""
        z_sem, sem_codes = self.semantic_quantizer.quantize(z)
        _, res_codes = self.quantizer.quantize(z - z_sem)
        return torch.cat([sem_codes, res_codes], 1)

    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, 1 + n_residual, T) -> (B, latent_dim, 4T)."""
        return self.upsample(self.post_module(self.codebook_sum(codes)))

    def codebook_sum(self, codes: Tensor) -> Tensor:
        """codes (B, 1 + n_residual, T) -> the sum of their codebooks' out_proj vectors (B, latent_dim,
        T) in decode_dtype: frame by frame, no state (decoding before the post-transformer)."""
        # Out-of-range codes are clamped as the reference does (it clamps the upper end only;
        # the lower end is clamped here too instead of failing in the embedding lookup).
        sem = codes[:, :1].clamp(0, self.semantic_codebook_size - 1)
        res = codes[:, 1:].clamp(0, self.residual_codebook_size - 1)
        return (self.semantic_quantizer.decode(sem) + self.quantizer.decode(res)).to(self.decode_dtype)

    @property
    def decode_dtype(self) -> torch.dtype:
        return next(self.post_module.parameters()).dtype


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, snake_eps: float):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(c_in, snake_eps),
            CausalConvTranspose1d(c_in, c_out, 2 * stride, stride),
            *(ResidualUnit(c_out, d, snake_eps) for d in (1, 3, 9)),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Decoder(nn.Module):
    """(B, latent_dim, 4T) -> (B, 1, 4T * hop_length) audio in [-1, 1]."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        dims = (cfg.decoder_dim, *cfg.decoder_block_dims)
        self.model = nn.Sequential(
            CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7),
            *(DecoderBlock(dims[i], dims[i + 1], s, cfg.snake_eps) for i, s in enumerate(cfg.decoder_rates)),
            Snake1d(dims[-1], cfg.snake_eps),
            CausalConv1d(dims[-1], 1, 7),
            nn.Tanh(),
        )
        self.channels_last = None  # ChannelsLastOps when streamed channels-last (use_channels_last)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def use_channels_last(self, ops) -> None:
        """Stream this decoder on channels-last activations with `ops` (engine/model/conv_kernel.py:
        its Triton kernels, or their PyTorch forms), in the decoders built after this call
        (engine/model/channels_last_decoder.py)."""
        if ops is None:
            raise ValueError("no channels-last operations given (conv_kernel.TRITON_OPS is None without Triton)")
        self.channels_last = ops


# --------------------------------------------------------------------------------------------------
# The codec


class ModdedDAC(nn.Module):
    """The S1-mini codec. Parameters are uninitialised: use load_codec() or random_codec().

    Run under torch.inference_mode(). For bf16/fp16, cast the module (`model.to(dtype)`), or only
    its decode path with `decode_in(dtype)`; the VQ distances, RoPE and RMSNorm statistics are
    computed in fp32 regardless.
    """

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quantizer = Quantizer(config)
        self.decoder = Decoder(config)

    @property
    def dtype(self) -> torch.dtype:
        """The encode path's dtype."""
        return next(self.encoder.parameters()).dtype

    def decode_in(self, dtype: torch.dtype) -> "ModdedDAC":
        """Run decoding (post_module, upsample, decoder) in `dtype` and keep encoding as it is: the
        reference engine encodes reference clips in fp32 and decodes under bf16 autocast."""
        for part in (self.quantizer.post_module, self.quantizer.upsample, self.decoder):
            part.to(dtype)
        return self

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, num_codebooks, T) integer -> audio (B, 1, T * frame_length) fp32 in [-1, 1]."""
        if codes.dim() != 3 or codes.shape[1] != self.config.num_codebooks:
            raise ValueError(f"codes must be (B, {self.config.num_codebooks}, T), got {tuple(codes.shape)}")
        return self.decoder(self.quantizer.decode(codes.long())).float()

    @torch.no_grad()
    def encode(self, audio: Tensor) -> Tensor:
        """audio (B, 1, n) at sample_rate -> codes (B, num_codebooks, ceil(n / frame_length)) int64.

        The input is right-padded with zeros to a whole number of frames.
        """
        if audio.dim() != 3 or audio.shape[1] != 1 or audio.shape[-1] == 0:
            raise ValueError(f"audio must be (B, 1, n) with n > 0, got {tuple(audio.shape)}")
        audio = F.pad(audio, (0, -audio.shape[-1] % self.config.frame_length)).to(self.dtype)
        return self.quantizer.encode(self.encoder(audio))

    def fuse_weight_norm(self) -> "ModdedDAC":
        """Replace every weight-normed conv by a plain one holding g v / |v| (computed in fp32)."""
        for module in list(self.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, WNConv):
                    setattr(module, name, child.fused())
        return self

    def drop_causal_masks(self) -> "ModdedDAC":
        """Free the persisted causal masks (~300 MB for S1-mini): attention never reads them."""
        for module in self.modules():
            if isinstance(module, WindowLimitedTransformer):
                del module.causal_mask
        return self


# --------------------------------------------------------------------------------------------------
# Loading and random weights


def load_codec(
    path: str | Path, config: CodecConfig | None = None, device: str | torch.device = "cpu", *,
    for_inference: bool = True,
) -> ModdedDAC:
    """Load codec.pth strictly (every key used, none missing, exact shapes) and return it in eval mode.

    config: None = `codec_config.json` beside the file if present, else CodecConfig.s1_mini().
    for_inference: fuse weight norm and drop the unused causal masks; the state_dict then no longer
    has the checkpoint's layout.
    """
    path = Path(path)
    beside = path.with_name("codec_config.json")
    if config is not None:
        config_source = "the config given"
    elif beside.is_file():
        config, config_source = CodecConfig.from_json(beside), str(beside)
    else:
        config, config_source = CodecConfig.s1_mini(), "the built-in S1-mini config"
    if not path.is_file():
        raise CheckpointError(f"codec checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read codec checkpoint {path}: {e}") from e
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
    if any(k.startswith("generator.") for k in state):
        # A training checkpoint: keep the generator, drop the discriminator.
        state = {k.removeprefix("generator."): v for k, v in state.items() if k.startswith("generator.")}

    with torch.device("meta"):
        model = ModdedDAC(config)
    expected = model.state_dict()
    _check_state_dict(state, expected, f"{path} (checked against {config_source})")
    # Floating tensors take the model's dtype (a checkpoint saved in half precision still loads).
    state = {k: v.to(expected[k].dtype) if v.is_floating_point() else v for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if for_inference:
        model.fuse_weight_norm().drop_causal_masks()
    return model.requires_grad_(False).eval().to(device)


def _check_state_dict(state: dict, expected: dict[str, Tensor], where: str) -> None:
    def listing(keys: list[str], limit: int = 8) -> str:
        more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
        return ", ".join(keys[:limit]) + more

    problems = []
    if missing := [k for k in expected if k not in state]:
        problems.append(f"{len(missing)} missing: {listing(missing)}")
    if unexpected := [k for k in state if k not in expected]:
        problems.append(f"{len(unexpected)} unexpected: {listing(unexpected)}")
    wrong = []
    for k, want in expected.items():
        got = state.get(k)
        if got is None:
            continue
        if not isinstance(got, Tensor):
            wrong.append(f"{k} is a {type(got).__name__}, not a tensor")
        elif got.shape != want.shape:
            wrong.append(f"{k} has shape {list(got.shape)}, expected {list(want.shape)}")
        elif got.is_floating_point() != want.is_floating_point() or (
            not want.is_floating_point() and got.dtype != want.dtype
        ):
            wrong.append(f"{k} has dtype {got.dtype}, expected {want.dtype}")
    if wrong:
        problems.append(f"{len(wrong)} mismatched: {listing(wrong)}")
    if problems:
        raise CheckpointError(
            f"{where} does not match the codec architecture ({len(expected)} tensors expected): "
            + "; ".join(problems)
            + ". Use the codec.pth of OpenAudio S1-mini, or put a codec_config.json describing "
            "this codec beside it."
        )


@torch.no_grad()
def random_codec(
    config: CodecConfig, seed: int = 0, device: str | torch.device = "cpu", *, for_inference: bool = True
) -> ModdedDAC:
    """A codec with random weights whose decoded audio is neither silent nor saturated (demo mode,
    benchmarks without the checkpoint). The same seed gives the same weights on the same kind of
    device (the numbers are drawn there: drawing 391M on the CPU took most of a benchmark's
    start-up); for_inference as in load_codec.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        model = ModdedDAC(config)

    def normal(p: Tensor, std: float = 1.0):
        p.copy_(torch.randn(p.shape, generator=gen, device=p.device) * std)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if "codebook" in name:
            normal(p)
        elif leaf in ("original0", "weight_g"):
            continue  # set to |v| below
        elif leaf in ("original1", "weight_v", "weight") and p.dim() > 1:
            normal(p, (p.numel() / p.shape[0]) ** -0.5)  # about unit gain per output
        elif leaf == "alpha":
            p.copy_(torch.exp(0.3 * torch.randn(p.shape, generator=gen, device=p.device)))
        elif leaf == "gamma":
            p.fill_(0.3)  # layer scale: keep residual branches small
        elif "norm" in name:
            p.fill_(1.0 if leaf == "weight" else 0.0)
        elif leaf == "bias":
            normal(p, 0.01)
        else:
            raise AssertionError(f"random_codec: no initialisation rule for {name}")
    # g = |v|: each weight-normed conv starts as its v.
    for m in model.modules():
        if isinstance(m, WNConv):
            g, v = m.g_v
            g.copy_(v.norm(dim=tuple(range(1, v.dim())), keepdim=True))

    # Scale the last conv so that a random code sequence decodes to ~0.25 rms before the tanh.
    model.eval()
    sizes = [config.semantic_codebook_size] + [config.residual_codebook_size] * config.n_residual_codebooks
    codes = torch.stack([torch.randint(0, n, (1, 16), generator=gen, device=gen.device) for n in sizes], dim=1)
    pre_tanh = model.decoder.model[:-1](model.quantizer.decode(codes))
    last = model.decoder.model[-2].conv
    scale = 0.25 / pre_tanh.std().item()
    last.g_v[0].mul_(scale)
    last.bias.mul_(scale)
    if for_inference:
        model.fuse_weight_norm().drop_causal_masks()
    return model.requires_grad_(False)
