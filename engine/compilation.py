"""The one place that decides how the decode step runs: compiled or eager, with or without CUDA graphs.

- CUDA: the step is captured as CUDA graphs (one replay per frame); with Triton and compile on, the
  captured step is the torch.compile'd one, otherwise the eager one (graphs need no Triton).
- CPU and MPS: eager, no graphs.
Compiled artefacts (Inductor FX graphs, AOT autograd, Triton kernels) persist under the cache dir,
so a restart with a warm cache does not recompile.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
from loguru import logger

from .errors import DeviceError


@dataclass(frozen=True)
class Environment:
    os: str
    torch: str
    cuda: bool
    triton: str | None  # version, or None when Triton cannot be imported

    @classmethod
    def detect(cls) -> "Environment":
        return cls(platform.system(), torch.__version__, torch.cuda.is_available(), _triton_version())


def _triton_version() -> str | None:
    # triton-windows installs the same `triton` module.
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton

        return triton.__version__
    except Exception:  # a broken install is the same as none: we must not crash at start-up
        return None


@dataclass(frozen=True)
class CompilePolicy:
    compile: bool
    cuda_graphs: bool
    reason: str
    mode: str = "default"  # torch.compile mode: default | max-autotune (graphs are ours, so never theirs)

    @property
    def inductor_options(self) -> dict:
        """Inductor settings of the compiled decode step (torch.compile's `options`; the graphs are ours).

        Coordinate-descent tuning also makes Inductor turn a matmul with one row (batch 1) into its
        own reduction kernel: the cast of int8 weights and the producer's pointwise work (norm scale,
        SiLU-gate) fuse into it, and the split-K GEMV's extra kernels go away."""
        options = {"coordinate_descent_tuning": True}
        if self.mode == "max-autotune":
            options["max_autotune"] = True
        return options

    def describe(self) -> str:
        mode = f"torch.compile ({self.mode}) + CUDA graphs" if self.compile and self.cuda_graphs else (
            "eager + CUDA graphs" if self.cuda_graphs else "eager")
        return f"{mode} ({self.reason})"


def decide(mode: str, device: torch.device, env: Environment | None = None,
           compile_mode: str = "default") -> CompilePolicy:
    """mode: auto | on | off (flag or S1_MINI_COMPILE); compile_mode: default | max-autotune."""
    env = env or Environment.detect()
    if device.type != "cuda":
        if mode == "on":
            logger.warning("compile was requested but the device is {}: running eager", device.type)
        return CompilePolicy(False, False, f"{device.type} runs eager")
    if mode == "off":
        return CompilePolicy(False, True, "compile turned off; CUDA graphs still cut launch overhead")
    if env.triton is None:
        if mode == "on":
            raise DeviceError("--compile needs Triton, which is not installed here (on Windows: pip install "
                              "triton-windows matching your torch); use --no-compile to run eager")
        return CompilePolicy(False, True, f"no Triton on {env.os}: eager step in CUDA graphs")
    return CompilePolicy(True, True, f"CUDA with Triton {env.triton} on {env.os}", compile_mode)


def configure_caches(cache_root: Path) -> dict[str, str]:
    """Point Inductor and Triton at persistent dirs (unless the user already did) and turn caches on."""
    dirs = {
        "TORCHINDUCTOR_CACHE_DIR": str(cache_root / "inductor"),
        "TRITON_CACHE_DIR": str(cache_root / "triton"),
    }
    for var, path in dirs.items():
        os.environ.setdefault(var, path)
        Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    inductor_config.autotune_local_cache = True
    try:
        import torch._functorch.config as functorch_config

        functorch_config.enable_autograd_cache = True
    except (ImportError, AttributeError):
        pass
    return {var: os.environ[var] for var in dirs}
