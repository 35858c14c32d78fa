"""The one place that decides how the decode step runs: compiled or eager, with or without CUDA graphs.

- CUDA: the step is captured as CUDA graphs (one replay per frame); with Triton and compile on, the
  captured step is the torch.compile'd one, otherwise the eager one (graphs need no Triton).
- CPU and MPS: eager, no graphs.
Compiled artefacts (Inductor FX graphs, AOT autograd, Triton kernels, and Dynamo's traced regions:
compiled_regions) persist under the cache dir, so a restart with a warm cache neither compiles nor
traces again.

Every Inductor, Dynamo and functorch setting made here is looked up first (supported_settings): torch
adds, renames and drops them between releases, and a setting this torch lacks is skipped with one
debug line, so the compiled step still runs, without that tuning.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
from loguru import logger

from . import compiled_regions
from .config import pdl_requested, use_cache_dirs
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
    int8_weights: bool = False  # the transformer runs torchao int8 weights (--quantize int8)
    pdl: bool = True  # programmatic dependent launch between Triton kernels (Hopper and newer); see decide()
    fused_projections: bool = True  # the decode step's projections as fused_linear kernels (Block.use_fused_projections)
    plain_weights: bool = True  # no --quantize: the compiled regions' graphs persist whole (compiled_regions)

    @property
    def inductor_options(self) -> dict:
        """Inductor settings of the compiled decode step (the CUDA graphs are ours, never Inductor's).
        max-autotune tunes matmul templates, and coordinate descent every Triton kernel: minutes of
        tuning at the first start, cached after.

        PDL lets a Triton kernel launch while the kernel before it finishes (a batch-1 frame is ~1,000
        small kernels, and PDL gains a few percent of frames/s; prefill is compiled with it too). Inductor
        enables it only on compute capability 9.0+ and keeps it safe: a kernel waits for its
        predecessor before touching what that one writes (or writing what it reads), and lets its
        own successor start only after that wait, so everything older than its predecessor has
        finished before it starts.

        With int8 weights Inductor's pattern matcher is off: it rewrites every int8 matmul of more
        than one row (prefill, batched decode) into aten._weight_int8pack_mm, whose CUDA kernel is
        ~10x slower than casting the weights and calling cuBLAS."""
        import torch._inductor.config as inductor_config

        options = {"max_autotune": True, "coordinate_descent_tuning": True} if self.mode == "max-autotune" else {}
        if self.pdl:
            options["triton.enable_pdl"] = True
        if self.int8_weights:
            options["pattern_matcher"] = False
        return supported_settings(inductor_config, options)

    def inductor_backend(self) -> "InductorBackend":
        """torch.compile backend of the compiled regions: Inductor with single-row matmuls decomposed."""
        return InductorBackend(self.inductor_options, store_tag=repr(self) if self.plain_weights else None)

    def describe(self) -> str:
        mode = f"torch.compile ({self.mode}) + CUDA graphs" if self.compile and self.cuda_graphs else (
            "eager + CUDA graphs" if self.cuda_graphs else "eager")
        return f"{mode} ({self.reason})"


class InductorBackend:
    """torch.compile backend: Inductor with these settings and single-row matmuls decomposed
    (DecompositionTable). store_key names what it compiles a graph into, for the compiled regions'
    store (compiled_regions), with `store_tag` (the policy: whatever else its regions were traced
    under); a tag of None keeps its regions out of the store. Quantized weights stay out: a stored
    graph's guards pickle its inputs' metadata, which torchao's tensors cannot give."""

    def __init__(self, options: dict, store_tag: str | None = ""):
        self.options = options
        self.store_key = (None if store_tag is None else
                          f"torch {torch.__version__}|{sorted(options.items())}|{_decomposition_version()}|{store_tag}")

    def __call__(self, graph, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(graph, example_inputs, config_patches=self.options, decompositions=DecompositionTable())


@functools.cache
def _has_pdl(device_index: int) -> bool:
    # ROCm reports its own architectures as capabilities (9.0 and up on MI200/MI300), and has no
    # griddepcontrol: PDL is NVIDIA's (Hopper and newer) only.
    return torch.version.hip is None and torch.cuda.get_device_capability(device_index) >= (9, 0)


def pdl_available(device: torch.device) -> bool:
    """Whether our Triton kernels use programmatic dependent launch: on CUDA devices of compute
    capability 9.0 and newer, unless requested off (pdl_requested)."""
    return device.type == "cuda" and pdl_requested() and _has_pdl(device.index or 0)


def has_setting(config, key: str) -> bool:
    """Whether a torch config module (torch._inductor.config, torch._dynamo.config, ...) has the
    setting `key`, dotted for nested ones ("triton.enable_pdl")."""
    node = config
    for part in key.split("."):
        try:
            node = getattr(node, part)
        except AttributeError:
            return False
    return True


@functools.cache
def _skipped(config_name: str, key: str) -> None:
    """Logs once per setting and process: the policy's options are read at every compile."""
    logger.debug("torch {} has no {}.{}: skipped (compiles without it)", torch.__version__, config_name, key)


def supported_settings(config, settings: dict) -> dict:
    """The settings this torch's `config` module has; each one it lacks is left out (one debug line)."""
    kept = {}
    for key, value in settings.items():
        if has_setting(config, key):
            kept[key] = value
        else:
            _skipped(config.__name__, key)
    return kept


def apply_settings(config, settings: dict) -> None:
    """Set each setting this torch's `config` module has; skip the others (supported_settings)."""
    for key, value in supported_settings(config, settings).items():
        *groups, name = key.split(".")
        node = config
        for group in groups:
            node = getattr(node, group)
        setattr(node, name, value)


def raise_recompile_limit(limit: int) -> None:
    """Dynamo's recompiles per function at least `limit` (every batch size and chunk length of one
    compiled function counts against it), where this torch has the setting."""
    import torch._dynamo.config as dynamo_config

    if has_setting(dynamo_config, "recompile_limit"):
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, limit)
    else:
        _skipped(dynamo_config.__name__, "recompile_limit")


def single_row_matmul(a: torch.Tensor, b: torch.Tensor):
    """aten.mm of a one-row matrix (every matmul of a batch-1 decode step) as a multiply-and-sum,
    which Inductor compiles into its own reduction kernel instead of calling a cuBLAS GEMV: the
    int8 weights' cast, the norm's scale and the SiLU gate fuse into it, and the split-K GEMV's
    memset and reduce kernels go away. Accumulates in fp32 like cuBLAS. Inductor does the same
    only under coordinate-descent tuning, whose search adds minutes to the first compile."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not statically_known_true(a.shape[0] == 1):
        return NotImplemented  # batched rows (a dynamic batch size included): the regular matmul
    return (a.unsqueeze(2).float() * b.unsqueeze(0).float()).sum(dim=1).to(a.dtype)


class DecompositionTable(dict):
    """Inductor's own decomposition table with single-row matmuls as multiply-and-sum
    (single_row_matmul), as compile_fx takes it.

    From torch 2.13 compile_fx pickles the table it is given into the key of its FX graph cache and
    into AOTAutograd's cache entries. About half of Inductor's own entries do not pickle, and with
    them every compile bypassed both caches: each start compiled every graph again. This table
    pickles as a call that rebuilds it. (torch 2.11 keeps the table out of the key; torch 2.12 wraps
    it in a closure that never pickles, so there the caches stay bypassed.) Neither cache keys the
    decompositions' code: tag_compile_caches does."""

    def __init__(self):
        from torch._inductor.decomposition import select_decomp_table

        super().__init__({**select_decomp_table(), torch.ops.aten.mm.default: single_row_matmul})

    def __reduce__(self):
        return DecompositionTable, ()


def tag_compile_caches() -> None:
    """Key Inductor's and AOTAutograd's caches by single_row_matmul's source too (torch's
    cache_key_tag, beside a tag the user set): a cached graph was lowered with the decomposition of
    its day, and neither cache would see a changed one."""
    import torch.compiler.config as compiler_config

    if not has_setting(compiler_config, "cache_key_tag"):
        return _skipped(compiler_config.__name__, "cache_key_tag")
    ours = f"s1-mini-decompositions-{_decomposition_version()}"
    theirs = [tag for tag in compiler_config.cache_key_tag.split("+")
              if tag and not tag.startswith("s1-mini-decompositions-")]
    compiler_config.cache_key_tag = "+".join([*theirs, ours])


@functools.cache
def _decomposition_version() -> str:
    import hashlib
    import inspect

    return hashlib.sha256(inspect.getsource(single_row_matmul).encode()).hexdigest()[:16]


def decide(mode: str, device: torch.device, env: Environment | None = None,
           compile_mode: str = "default", quantize: str = "none", fused_projections: bool = True) -> CompilePolicy:
    """mode: auto | on | off (flag or S1_MINI_COMPILE); compile_mode: default | max-autotune;
    quantize: the transformer's --quantize mode; fused_projections: EngineConfig's."""
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
    return CompilePolicy(True, True, f"CUDA with Triton {env.triton} on {env.os}", compile_mode, quantize == "int8",
                         pdl_requested(), fused_projections, plain_weights=quantize == "none")


def _inductor_default_cache_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return os.path.abspath(default_cache_dir())


def _pin_ptxas() -> None:
    """Point Triton at the ptxas Inductor picks (by Inductor's own helper) before our kernels compile.
    Triton's cache key holds the ptxas version, and Inductor sets TRITON_PTXAS_PATH only once it
    compiles a kernel: without the pin, a cold start (Inductor compiles) caches our kernels under keys
    that a warm start (Inductor loads from its cache, sets nothing) misses, and the warm start
    compiles them again. A path the user set wins; where torch bundles no ptxas, the helper sets
    nothing, in either start."""
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
    except ImportError:
        try:  # where older torch versions keep it
            from torch._inductor.codecache import _set_triton_ptxas_path
        except ImportError:  # no such helper: Inductor sets nothing, nothing to match
            return
    _set_triton_ptxas_path()


def configure_caches(cache_root: Path) -> dict[str, str]:
    """Point Inductor and Triton at persistent dirs (unless the user already did) and turn caches on."""
    dirs = {
        "TORCHINDUCTOR_CACHE_DIR": str(cache_root / "inductor"),
        "TRITON_CACHE_DIR": str(cache_root / "triton"),
    }
    dirs = use_cache_dirs(dirs, {"TORCHINDUCTOR_CACHE_DIR": _inductor_default_cache_dir()})
    for path in dirs.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    _pin_ptxas()
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    apply_settings(inductor_config, {"fx_graph_cache": True, "autotune_local_cache": True})
    apply_settings(functorch_config, {"enable_autograd_cache": True})
    tag_compile_caches()
    compiled_regions.use_store(cache_root / "regions")
    return dirs
