"""DualARConfig: the S1-mini transformer's architecture, read from the checkpoint's config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import CheckpointError

# Keys of the released config.json that change the architecture we build.
_REQUIRED_KEYS = (
    "dim", "n_layer", "n_head", "n_local_heads", "head_dim", "intermediate_size", "vocab_size",
    "codebook_size", "num_codebooks", "max_seq_len", "rope_base", "norm_eps",
    "n_fast_layer", "model_type",
)


@dataclass(frozen=True)
class DualARConfig:
    dim: int
    n_layer: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    codebook_size: int
    num_codebooks: int
    max_seq_len: int
    rope_base: float
    norm_eps: float
    n_fast_layer: int
    fast_dim: int
    fast_n_head: int
    fast_n_local_heads: int
    fast_head_dim: int
    fast_intermediate_size: int
    attention_qk_norm: bool = True
    attention_qkv_bias: bool = False
    attention_o_bias: bool = False
    fast_attention_qk_norm: bool = False
    fast_attention_qkv_bias: bool = False
    fast_attention_o_bias: bool = False
    scale_codebook_embeddings: bool = True
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    @classmethod
    def from_dict(cls, raw: dict) -> "DualARConfig":
        missing = [k for k in _REQUIRED_KEYS if k not in raw]
        if missing:
            raise CheckpointError(f"config.json lacks required keys {missing}; is this an S1-mini checkpoint?")
        if raw["model_type"] != "dual_ar":
            raise CheckpointError(
                f"config.json has model_type {raw['model_type']!r}; only 'dual_ar' (OpenAudio S1 / S1-mini) is supported"
            )
        values = dict(raw)
        if values.get("n_local_heads", -1) == -1:
            values["n_local_heads"] = values["n_head"]
        # A missing fast_* field falls back to its slow counterpart, as in the reference.
        for name in ("dim", "n_head", "n_local_heads", "head_dim", "intermediate_size"):
            values.setdefault(f"fast_{name}", values[name])
        if values.get("fast_n_local_heads", -1) == -1:
            values["fast_n_local_heads"] = values["fast_n_head"]
        known = {f.name for f in fields(cls)}
        config = cls(**{k: v for k, v in values.items() if k in known})
        config.validate()
        return config

    @classmethod
    def from_json(cls, path: str | Path) -> "DualARConfig":
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path} not found") from None
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path} is not valid JSON ({exc}); re-download the checkpoint") from None
        return cls.from_dict(raw)

    def validate(self) -> None:
        problems = []
        if self.n_head % self.n_local_heads or self.fast_n_head % self.fast_n_local_heads:
            problems.append("query heads must be a multiple of KV heads")
        if self.head_dim % 2 or self.fast_head_dim % 2:
            problems.append("head dims must be even (RoPE works on pairs)")
        if self.tie_word_embeddings:
            problems.append("tied word embeddings are not part of S1-mini")
        if self.fast_dim != self.dim:
            problems.append("fast_dim != dim needs a fast_project_in layer, which S1-mini does not have")
        if problems:
            raise CheckpointError("unsupported model config: " + "; ".join(problems))
