"""EngineConfig: the one validated set of engine settings.

Built from keyword arguments (launch.py flags, the engine CLI, tests) with `S1_MINI_*` environment
variables as fallbacks. This is the only module of the engine that reads the environment: the
engine's settings, and the two torch variables the engine must respect (pdl_requested,
use_cache_dirs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import InputError
from .runtime.scheduler import ADMIT_GATHER_STEPS, ADMIT_MIN_LEAD_S, READ_BACK_LAG, SchedulerConfig

DEFAULT_REPO_ID = "fishaudio/openaudio-s1-mini"
DEFAULT_LOCAL_CHECKPOINT = Path("checkpoints/openaudio-s1-mini")

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
COMPILE_MODES = ("auto", "on", "off")
QUANTIZE_MODES = ("none", "int8", "int4", "fp8")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


MAX_LONE_CLIP_CHUNK_FRAMES = 256  # ~0.5 GB of fp32 activations in the encoder's first blocks


@dataclass(frozen=True)
class EngineConfig:
    # Local directory or Hugging Face repo id; None = ./checkpoints/openaudio-s1-mini if present,
    # else the default repo id.
    checkpoint: str | None = None
    demo: bool = False  # tiny random model: runs anywhere in seconds, produces noise
    random_weights: bool = False  # full-size random weights: for benchmarks without the checkpoint
    device: str = "auto"
    precision: str = "auto"
    compile: str = "auto"
    # torch.compile mode of the decode step's blocks: "default" compiles fast; "max-autotune"
    # benchmarks Triton matmul templates (longer first compile, cached afterwards).
    compile_mode: str = "default"
    quantize: str = "none"
    # Sequences decoded at once (KV slots); 0 = auto: 64 on CUDA (capped by free memory), 4 elsewhere.
    max_batch_size: int = 0
    max_text_length: int = 2000  # characters per request; 0 = no limit
    max_queue: int = 64
    max_reference_seconds: float = 90.0
    # KV-cache positions per sequence (prompt + generated frames); 0 = the model's maximum (8192).
    # 4096 holds a 90 s reference with its transcript plus 1024 new frames, in half the memory.
    max_context: int = 4096
    cache_dir: str | None = None  # None = the platformdirs user cache dir
    voices_dir: str | None = None  # None = the platformdirs user data dir / voices
    seed: int | None = None  # engine-wide default seed for requests that give none
    # Sample codebook 0 over the whole vocabulary as the reference does, instead of over the
    # semantic tokens and <|im_end|> only (slower: reads the full 155,776-row output matrix).
    exact_sampling: bool = False
    # CUDA: the GPU worker thread's own work (prefill, copies) and its step graphs go on
    # high-priority streams, ahead of the codec's low-priority ones
    # (graph_capture.use_high_priority_stream).
    decode_priority: bool = True
    # Python's GIL switch interval (its default is 5 ms), set process-wide when the engine starts;
    # 0 = leave it as it is. The GPU worker thread, which launches every step, waits up to this long
    # for the GIL when the web server's threads hold it.
    switch_interval_ms: float = 0.5
    # Steps the GPU worker launches after a step before it reads that step's frame counts: the
    # steps queued ahead of the GPU while the host hands out frames (engine/runtime/scheduler.py).
    read_back_lag: int = READ_BACK_LAG
    # Admission while sequences run (engine/runtime/scheduler.py): steps a new arrival waits for
    # others to share its prefill call, and the audio, in seconds, every new listener must have
    # ahead before more requests are admitted; 0 turns either off.
    admit_gather_steps: int = ADMIT_GATHER_STEPS
    admit_min_lead_s: float = ADMIT_MIN_LEAD_S
    # New reference clips encoded in one pass at most (capped by max_batch_size); 1 encodes them one
    # at a time. A batch takes less GPU time per clip: beside 64 running streams that send a new clip
    # every third request, clips wait less for their codes in batches. Each batch bucket (1, 2, 4,
    # ... up to this) keeps a CUDA graph.
    max_encode_batch: int = 8
    # Frames a pass of one reference clip alone encodes per graph replay (passes of more clips: 32).
    # A lone clip's pass takes its GPU time more in its kernels' number than in their work: on an idle
    # H100 a 256-frame clip took 27 ms in 128-frame chunks against 45 ms in 32-frame ones (batches of
    # four or eight gain little or lose; docs/PERFORMANCE.md has the default mix under load).
    lone_clip_chunk_frames: int = 128
    # CUDA: reference encodes run at the decode steps' stream priority rather than the codec's
    # lowest one: a request waiting for its clip's codes holds a slot that decodes nothing.
    encode_priority: bool = True
    # Fused Triton kernels for the decode step's projections where they apply; False: compiled
    # matmuls (for comparisons).
    fused_projections: bool = True
    # On a first start (CUDA with torch.compile, the compiled regions' store without their graphs),
    # helper processes compile the prefill's and the codec's while the engine compiles the decode
    # step's (compile_helpers).
    compile_helpers: bool = True

    def __post_init__(self):
        _one_of("device", self.device.split(":")[0], DEVICES)
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("compile", self.compile, COMPILE_MODES)
        _one_of("compile_mode", self.compile_mode, ("default", "max-autotune"))
        _one_of("quantize", self.quantize, QUANTIZE_MODES)
        if self.demo and self.random_weights:
            raise InputError("choose either demo (tiny model) or random_weights (full size), not both")
        if self.max_batch_size < 0:
            raise InputError(f"max_batch_size must be >= 0 (0 = auto), got {self.max_batch_size}")
        if self.max_queue < 1:
            raise InputError(f"max_queue must be at least 1, got {self.max_queue}")
        if self.max_text_length < 0:
            raise InputError(f"max_text_length must be >= 0 (0 = no limit), got {self.max_text_length}")
        if self.max_context < 0:
            raise InputError(f"max_context must be >= 0 (0 = the model's maximum), got {self.max_context}")
        if self.max_reference_seconds <= 0:
            raise InputError("max_reference_seconds must be positive")
        if self.max_encode_batch < 1:
            raise InputError(f"max_encode_batch must be at least 1, got {self.max_encode_batch}")
        if not 1 <= self.lone_clip_chunk_frames <= MAX_LONE_CLIP_CHUNK_FRAMES:
            raise InputError(f"lone_clip_chunk_frames must be 1 to {MAX_LONE_CLIP_CHUNK_FRAMES} (a chunk's "
                             f"activations grow with it), got {self.lone_clip_chunk_frames}")
        self.scheduler_config()  # validates the scheduler's settings
        if self.switch_interval_ms < 0:
            raise InputError(f"switch_interval_ms must be >= 0 (0 = leave it as it is), got {self.switch_interval_ms}")

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(self.read_back_lag, self.admit_gather_steps, self.admit_min_lead_s)

    @classmethod
    def from_env(cls, environ: dict | None = None, **overrides) -> "EngineConfig":
        """Settings from `S1_MINI_<FIELD>` variables, then `overrides` (None values are ignored)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(f"S1_MINI_{f.name.upper()}")
            if raw is not None:
                values[f.name] = _parse(f.name, raw, f.type)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _one_of(name: str, value: str, allowed: tuple[str, ...]):
    if value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def parse_switch(variable: str, raw: str) -> bool:
    """An on/off variable's value: 1/true/yes/on or 0/false/no/off (or empty)."""
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InputError(f"{variable} must be true or false (1/0, yes/no, on/off), got {raw!r}")


def _parse(name: str, raw: str, type_name: str):
    text = raw.strip()
    if "bool" in type_name:
        return parse_switch(f"S1_MINI_{name.upper()}", raw)
    if "None" in type_name and text == "":
        return None
    try:
        if type_name.startswith("int"):
            return int(text)
        if type_name.startswith("float"):
            return float(text)
    except ValueError:
        raise InputError(f"S1_MINI_{name.upper()} must be a number, got {raw!r}") from None
    return text


def pdl_requested(environ=None) -> bool:
    """Programmatic dependent launch unless turned off: Inductor's own switch turns it off for our
    kernels too (our backend would otherwise set it over the user's choice)."""
    environ = os.environ if environ is None else environ
    return environ.get("TORCHINDUCTOR_ENABLE_PDL", "1") != "0"


def use_cache_dirs(dirs: dict[str, str], torch_defaults: dict[str, str | None]) -> dict[str, str]:
    """Point torch's cache variables (name -> dir) at `dirs` unless the user already did, and return
    the dirs in effect. A variable holding torch's default (`torch_defaults`) counts as unset:
    importing torch._dynamo writes Inductor's default (a temp dir, lost on reboot) into the
    environment, and that value is torch's, not the user's."""
    for var, path in dirs.items():
        if os.environ.get(var) in (None, torch_defaults.get(var)):
            os.environ[var] = path
    return {var: os.environ[var] for var in dirs}
