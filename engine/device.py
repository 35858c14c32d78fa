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
            reasons.append(_no_gpu_reason())
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


# Concurrent sequences (KV slots) when max_batch_size is 0 (auto).
AUTO_SLOTS = {"cuda": 64}
AUTO_SLOTS_ELSEWHERE = 4
KV_MEMORY_SHARE = 0.5  # of the free GPU memory; the rest is for graphs, codec activations, prefixes


def slots_that_fit(requested: int, bytes_per_slot: int, device: torch.device) -> tuple[int, str]:
    """How many KV slots to allocate, and why: `requested` (0 = auto), capped on CUDA by what fits
    in KV_MEMORY_SHARE of the free memory."""
    wanted = requested or AUTO_SLOTS.get(device.type, AUTO_SLOTS_ELSEWHERE)
    how = "as configured" if requested else f"auto for {device.type}"
    if device.type != "cuda":
        return wanted, how
    free, _ = torch.cuda.mem_get_info(device)
    fit = int(free * KV_MEMORY_SHARE // bytes_per_slot)
    if fit < 1:
        raise DeviceError(f"not enough free GPU memory for one sequence ({bytes_per_slot / 1e9:.2f} GB of KV cache "
                          f"needed, {free / 1e9:.2f} GB free); lower S1_MINI_MAX_CONTEXT or --max-batch-size, or free the GPU")
    if fit < wanted:
        return fit, f"{how}, capped to what fits in half of the {free / 1e9:.1f} GB free GPU memory"
    return wanted, how


def _no_gpu_reason() -> str:
    if torch.version.cuda is None:
        return "device cpu because no GPU was found (this torch is built without CUDA)"
    # A CUDA build that finds no usable GPU: none there, or a driver older than the build needs.
    return (f"device cpu because no usable CUDA GPU was found; this torch is built for CUDA {torch.version.cuda}: "
            "with an NVIDIA GPU, check that its driver supports that CUDA version (nvidia-smi shows the driver's), "
            "or install a torch build for an older CUDA (README)")


def copy_may_overlap(device) -> bool:
    """Whether a copy from pageable host memory to `device` may be queued (non_blocking=True) while
    the source goes out of scope. CUDA stages a pageable source before the call returns; MPS may read
    it later, after it is freed, and copies garbage (pytorch/pytorch#139550): copy synchronously there."""
    return torch.device(device).type == "cuda"
