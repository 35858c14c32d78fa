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

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import CheckpointError
from .codec_config import CodecConfig
from .codec_convs import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, ResidualUnit, Snake1d, WNConv
from .codec_transformer import WindowLimitedTransformer

__all__ = ["CodecConfig", "ModdedDAC", "load_codec", "random_codec"]


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
        self.stream_pointwise = None  # how streamed encoders run residual units (stream_pointwise_with)

    def stream_pointwise_with(self, ops) -> None:
        """Stream the residual units fused, with `ops` (codec_streamers.PointwiseOps) for their
        pointwise passes, in the streaming encoders built after this call; None: the module's own ops."""
        self.stream_pointwise = ops

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
