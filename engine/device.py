"""Device and precision choice, with the reason for each (logged at start-up)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import DeviceError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype
    precision: str
    reason: str


def choose_placement(device: str, precision: str) -> Placement:
    reasons = []
    if device == "auto":
        if torch.cuda.is_available():
            dev = torch.device("cuda")
            reasons.append(f"device cuda ({torch.cuda.get_device_name(0)}) because a CUDA GPU is available")
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            dev = torch.device("mps")
            reasons.append("device mps because Apple Metal is available")
        else:
            dev = torch.device("cpu")
            reasons.append("device cpu because no GPU was found")
    else:
        dev = torch.device(device)
        _check_available(dev)
        reasons.append(f"device {dev} as requested")

    if precision == "auto":
        if dev.type == "cuda":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
            reasons.append(f"precision {precision}: the fastest exact-enough format on this GPU")
        elif dev.type == "mps":
            precision = "fp16"
            reasons.append("precision fp16 on Apple Metal")
        else:
            precision = "fp32"
            reasons.append("precision fp32 because half precision is slow on CPUs")
    else:
        if precision == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise DeviceError("this GPU cannot run bf16; use --precision fp16 or fp32")
        reasons.append(f"precision {precision} as requested")
    return Placement(dev, DTYPES[precision], precision, "; ".join(reasons))


def _check_available(dev: torch.device) -> None:
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("--device cuda was requested but this PyTorch build sees no CUDA GPU; "
                              "install a CUDA build of torch or use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"{dev} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceError("--device mps was requested but Apple Metal is not available; use --device cpu")


def memory_gb(device: torch.device) -> tuple[float | None, float | None]:
    """(allocated now, peak) in GB on a CUDA device; (None, None) elsewhere."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.memory_allocated(device) / 1e9, torch.cuda.max_memory_allocated(device) / 1e9
