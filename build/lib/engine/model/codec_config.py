"""CodecConfig: every hyperparameter of the modded-DAC codec (OpenAudio S1-mini `codec.pth`).

The reference builds the codec from a Hydra yaml; we keep a flat JSON file instead
(`codec_config.json`, same layout as tests/fixtures/codec-tiny/config.json). `CodecConfig.s1_mini()`
holds the values of the released codec.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import get_args, get_origin, get_type_hints

from ..errors import CheckpointError


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """A window-limited causal transformer of the codec (SwiGLU FFN, interleaved RoPE, RMSNorm)."""

    dim: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    window_size: int  # a query sees itself and the window_size - 1 keys before it
    block_size: int  # rows of the persisted RoPE table and causal mask: max frames per call
    rope_base: float
    norm_eps: float
    layer_scale: bool


@dataclass(frozen=True, kw_only=True)
class EncoderTransformerConfig(TransformerConfig):
    in_block: int  # index of the encoder block whose last layer is the transformer
    layers_per_block: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class QuantizerTransformerConfig(TransformerConfig):
    modules: tuple[str, ...]  # always ("pre_module", "post_module")
    n_layer: int


@dataclass(frozen=True, kw_only=True)
class ConvNeXtConfig:
    dim: int
    kernel_size: int
    mlp_ratio: int
    layernorm_eps: float


@dataclass(frozen=True, kw_only=True)
class CodecConfig:
    sample_rate: int
    causal: bool
    encoder_dim: int
    encoder_rates: tuple[int, ...]
    encoder_block_dims: tuple[int, ...]
    latent_dim: int
    hop_length: int
    downsample_factor: tuple[int, ...]
    frame_length: int
    decoder_dim: int
    decoder_rates: tuple[int, ...]
    decoder_block_dims: tuple[int, ...]
    # Listed by the reference yaml but never built: the decoder holds no transformer.
    decoder_transformer_layers: tuple[int, ...]
    encoder_transformer: EncoderTransformerConfig
    quantizer_transformer: QuantizerTransformerConfig
    convnext: ConvNeXtConfig
    semantic_codebook_size: int
    n_residual_codebooks: int
    residual_codebook_size: int
    codebook_dim: int
    num_codebooks_total: int
    snake_eps: float
    rmsnorm_eps: float

    def __post_init__(self):
        self._validate()

    @property
    def frame_rate(self) -> float:
        """Codes per second of audio (one code per codebook every frame_length samples)."""
        return self.sample_rate / self.frame_length

    @property
    def num_codebooks(self) -> int:
        return self.num_codebooks_total

    @classmethod
    def from_dict(cls, d: dict) -> "CodecConfig":
        """Keys as in codec_config.json; keys ending in `_note` are comments and ignored."""
        d = {k: v for k, v in d.items() if not k.endswith("_note")}
        return _build(cls, d, "codec config")

    @classmethod
    def from_json(cls, path: str | Path) -> "CodecConfig":
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read codec config {path}: {e}") from e
        if not isinstance(d, dict):
            raise CheckpointError(f"codec config {path} must hold a JSON object")
        try:
            return cls.from_dict(d)
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from e

    def to_dict(self) -> dict:
        return _plain(asdict(self))

    @classmethod
    def s1_mini(cls) -> "CodecConfig":
        """The released OpenAudio S1-mini codec (fish-speech modded_dac_vq.yaml)."""
        return cls(
            sample_rate=44100,
            causal=True,
            encoder_dim=64,
            encoder_rates=(2, 4, 8, 8),
            encoder_block_dims=(128, 256, 512, 1024),
            latent_dim=1024,
            hop_length=512,
            downsample_factor=(2, 2),
            frame_length=2048,
            decoder_dim=1536,
            decoder_rates=(8, 8, 4, 2),
            decoder_block_dims=(768, 384, 192, 96),
            decoder_transformer_layers=(4, 0, 0, 0),
            encoder_transformer=EncoderTransformerConfig(
                in_block=3, layers_per_block=(0, 0, 0, 4), dim=1024, n_head=16, n_local_heads=16,
                head_dim=64, intermediate_size=3072, window_size=512, block_size=16384,
                rope_base=10000, norm_eps=1e-5, layer_scale=True,
            ),
            quantizer_transformer=QuantizerTransformerConfig(
                modules=("pre_module", "post_module"), n_layer=8, dim=1024, n_head=16,
                n_local_heads=16, head_dim=64, intermediate_size=3072, window_size=128,
                block_size=4096, rope_base=10000, norm_eps=1e-5, layer_scale=True,
            ),
            convnext=ConvNeXtConfig(dim=1024, kernel_size=7, mlp_ratio=4, layernorm_eps=1e-6),
            semantic_codebook_size=4096,
            n_residual_codebooks=9,
            residual_codebook_size=1024,
            codebook_dim=8,
            num_codebooks_total=10,
            snake_eps=1e-9,
            rmsnorm_eps=1e-5,
        )

    def _validate(self):
        def check(ok: bool, msg: str):
            if not ok:
                raise CheckpointError(f"invalid codec config: {msg}")

        enc, qt, cn = self.encoder_transformer, self.quantizer_transformer, self.convnext
        check(self.causal, "only the causal codec (causal: true) is supported")
        n_enc = len(self.encoder_rates)
        check(len(self.encoder_block_dims) == n_enc,
              f"encoder_block_dims has {len(self.encoder_block_dims)} entries, encoder_rates {n_enc}")
        check(len(self.decoder_block_dims) == len(self.decoder_rates),
              f"decoder_block_dims has {len(self.decoder_block_dims)} entries, "
              f"decoder_rates {len(self.decoder_rates)}")
        check(self.hop_length == math.prod(self.encoder_rates),
              f"hop_length {self.hop_length} != product of encoder_rates {math.prod(self.encoder_rates)}")
        check(self.frame_length == self.hop_length * math.prod(self.downsample_factor),
              f"frame_length {self.frame_length} != hop_length x product of downsample_factor")
        check(math.prod(self.decoder_rates) == self.hop_length,
              f"product of decoder_rates {math.prod(self.decoder_rates)} != hop_length {self.hop_length}: "
              "decoded audio would not be frame_length samples per code")
        check(len(enc.layers_per_block) == n_enc and 0 <= enc.in_block < n_enc,
              f"encoder_transformer: layers_per_block needs {n_enc} entries and in_block an index into them")
        check(all(n == 0 for i, n in enumerate(enc.layers_per_block) if i != enc.in_block),
              "encoder_transformer: only block in_block may hold transformer layers")
        check(enc.dim == self.encoder_block_dims[enc.in_block],
              f"encoder_transformer.dim {enc.dim} != encoder_block_dims[in_block] "
              f"{self.encoder_block_dims[enc.in_block]}")
        check(tuple(qt.modules) == ("pre_module", "post_module"),
              f"quantizer_transformer.modules must be ['pre_module', 'post_module'], got {list(qt.modules)}")
        check(qt.dim == self.latent_dim and cn.dim == self.latent_dim,
              "quantizer_transformer.dim and convnext.dim must equal latent_dim")
        for name, t in (("encoder_transformer", enc), ("quantizer_transformer", qt)):
            check(t.n_head * t.head_dim == t.dim, f"{name}: n_head x head_dim must equal dim")
            check(t.n_local_heads > 0 and t.n_head % t.n_local_heads == 0,
                  f"{name}: n_head must be a multiple of n_local_heads")
            check(t.head_dim % 2 == 0, f"{name}: head_dim must be even (RoPE rotates pairs)")
            check(0 < t.window_size and 0 < t.block_size, f"{name}: window_size and block_size must be > 0")
            check(t.norm_eps == self.rmsnorm_eps, f"{name}.norm_eps must equal rmsnorm_eps")
        check(self.num_codebooks_total == 1 + self.n_residual_codebooks,
              "num_codebooks_total must be 1 + n_residual_codebooks")
        dims = (self.encoder_dim, self.latent_dim, self.decoder_dim, self.codebook_dim,
                self.semantic_codebook_size, self.residual_codebook_size, *self.encoder_block_dims,
                *self.decoder_block_dims, *self.encoder_rates, *self.decoder_rates, *self.downsample_factor)
        check(all(d > 0 for d in dims), "every size and rate must be positive")


def _build(cls, d: dict, where: str):
    """Instantiate a config dataclass from a dict with exactly its field names (nested ones too)."""
    names = [f.name for f in fields(cls)]
    problems = []
    if missing := [n for n in names if n not in d]:
        problems.append(f"missing keys {missing}")
    if unknown := [k for k in d if k not in names]:
        problems.append(f"unknown keys {unknown}")
    if problems:
        raise CheckpointError(f"{where}: {'; '.join(problems)}")
    hints = get_type_hints(cls)
    values = {}
    for name in names:
        v = d[name]
        if name in _SUBCONFIGS:
            if not isinstance(v, dict):
                raise CheckpointError(f"{where}: {name} must be an object")
            v = _build(_SUBCONFIGS[name], v, f"{where}.{name}")
        elif not _type_ok(v, hints[name]):
            raise CheckpointError(f"{where}: {name} = {v!r} is not of type {_type_name(hints[name])}")
        values[name] = tuple(v) if isinstance(v, list) else v
    return cls(**values)


def _type_ok(v, hint) -> bool:
    if get_origin(hint) is tuple:  # tuple[X, ...] arrives as a JSON list
        return isinstance(v, (list, tuple)) and all(_type_ok(x, get_args(hint)[0]) for x in v)
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, hint)


def _type_name(hint) -> str:
    return f"list of {get_args(hint)[0].__name__}" if get_origin(hint) is tuple else hint.__name__


_SUBCONFIGS = {
    "encoder_transformer": EncoderTransformerConfig,
    "quantizer_transformer": QuantizerTransformerConfig,
    "convnext": ConvNeXtConfig,
}


def _plain(v):
    """asdict() output with tuples as lists, as JSON writes them."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
