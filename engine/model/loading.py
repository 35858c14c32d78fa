"""Strict loading of model.pth into DualARTransformer, and full-size random weights."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from .dual_ar import DualARTransformer, TokenLayout
from .dual_ar_config import DualARConfig

# Released checkpoints are plain state dicts; fine-tunes sometimes wrap or prefix them.
_WRAPPER_KEY = "state_dict"
_PREFIX = "model."


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """torch.load a weights-only checkpoint (memory-mapped) with clear errors."""
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # zip, pickle or mmap errors all mean the same thing to the user
        raise CheckpointError(
            f"cannot read {path}: {type(exc).__name__}: {exc}. The file is probably truncated or not a "
            "PyTorch checkpoint; delete it and download it again"
        ) from None
    if isinstance(state, dict) and _WRAPPER_KEY in state and isinstance(state[_WRAPPER_KEY], dict):
        state = state[_WRAPPER_KEY]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return state


def normalise_llm_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip a `model.` prefix, drop unused `audio_` keys, fuse legacy separate wq/wk/wv."""
    if state and next(iter(state)).startswith(_PREFIX):
        state = {k.removeprefix(_PREFIX): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if "audio_" not in k}
    for key in [k for k in state if k.endswith(".attention.wq.weight")]:
        base = key.removesuffix("wq.weight")
        parts = [state.pop(base + name + ".weight") for name in ("wq", "wk", "wv")]
        state[base + "wqkv.weight"] = torch.cat(parts, dim=0)
    return state


def check_state_matches(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Every key used, none missing, shapes exact; otherwise a CheckpointError naming the keys."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {expected[k]}"
        for k in set(expected) & set(state) if tuple(state[k].shape) != expected[k]
    )
    problems = []
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong)):
        if items:
            shown = ", ".join(items[:8]) + (f" (+{len(items) - 8} more)" if len(items) > 8 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise CheckpointError(
            f"{source} does not match the model built from its config.json ({'; '.join(problems)}). "
            "Check that config.json and the weights come from the same OpenAudio S1-mini checkpoint"
        )


def load_dual_ar(checkpoint_dir: Path, layout: TokenLayout, device: torch.device | str,
                 dtype: torch.dtype) -> DualARTransformer:
    config = DualARConfig.from_json(checkpoint_dir / "config.json")
    with torch.device("meta"):
        model = DualARTransformer(config, layout)
    state = normalise_llm_state(read_state_dict(checkpoint_dir / "model.pth"))
    check_state_matches(model, state, str(checkpoint_dir / "model.pth"))
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.reset_buffers(device)
    return model.eval().requires_grad_(False)


def random_dual_ar(config: DualARConfig, layout: TokenLayout, device: torch.device | str, dtype: torch.dtype,
                   seed: int = 0) -> DualARTransformer:
    """Random weights drawn on the target device (N(0, initializer_range), norms at 1)."""
    with torch.device("meta"):
        model = DualARTransformer(config, layout)
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, param in model.state_dict().items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(param.shape, device=device, dtype=dtype)
        else:
            values = torch.randn(param.shape, generator=gen, device=device, dtype=torch.float32)
            state[name] = (values * config.initializer_range).to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.reset_buffers(device)
    return model.eval().requires_grad_(False)
