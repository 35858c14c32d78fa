"""The compile policy: every platform gets a decision and a reason, never a crash."""

import dataclasses
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from engine import compilation, compile_helpers
from engine.compilation import Environment, decide, single_row_matmul
from engine.errors import DeviceError
from engine.runtime.step_runner import bucket_for, buckets_up_to

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.device("cuda")
LINUX_TRITON = Environment("Linux", "2.13.0", True, "3.7.0")
WINDOWS_NO_TRITON = Environment("Windows", "2.13.0", True, None)


def test_cuda_with_triton_compiles_and_captures_graphs():
    policy = decide("auto", CUDA, LINUX_TRITON)
    assert policy.compile and policy.cuda_graphs
    assert "Triton 3.7.0" in policy.describe()


def test_windows_without_triton_runs_the_eager_step_in_graphs():
    policy = decide("auto", CUDA, WINDOWS_NO_TRITON)
    assert not policy.compile and policy.cuda_graphs
    assert "no Triton" in policy.reason


def test_compile_on_without_triton_is_a_clear_error():
    with pytest.raises(DeviceError, match="--no-compile"):
        decide("on", CUDA, WINDOWS_NO_TRITON)


def test_no_compile_keeps_cuda_graphs():
    policy = decide("off", CUDA, LINUX_TRITON)
    assert not policy.compile and policy.cuda_graphs


@pytest.mark.parametrize("device", ["cpu", "mps"])
@pytest.mark.parametrize("mode", ["auto", "on", "off"])
def test_cpu_and_mps_run_eager_whatever_is_asked(device, mode):
    policy = decide(mode, torch.device(device), LINUX_TRITON)
    assert not policy.compile and not policy.cuda_graphs
    assert device in policy.reason


import torch._dynamo.config as dynamo_config  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402

# On by default where this torch's Inductor has the setting (it applies it on compute capability 9.0+ only).
PDL = {"triton.enable_pdl": True} if compilation.has_setting(inductor_config, "triton.enable_pdl") else {}


@pytest.fixture(autouse=True)
def _no_pdl_choice_in_the_environment(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_ENABLE_PDL", raising=False)


@pytest.mark.parametrize("hip, capability, expected", [(None, (9, 0), True), (None, (8, 9), False),
                                                      ("6.2", (9, 4), False)])
def test_our_kernels_use_pdl_on_nvidia_hopper_and_newer_only(monkeypatch, hip, capability, expected):
    """ROCm reports MI300 as capability 9.4: it has no griddepcontrol, so no PDL there."""
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    assert compilation._has_pdl.__wrapped__(0) is expected


@pytest.fixture
def debug_lines(log_lines):
    compilation._skipped.cache_clear()
    yield log_lines
    compilation._skipped.cache_clear()


def torch_without(monkeypatch, *missing: str):
    """As on a torch that dropped or renamed these settings. Torch's config modules themselves are
    left alone: deleting a setting, or pytest's monkeypatch on one (torch 2.14), hides it from torch
    for the rest of the process."""
    real = compilation.has_setting
    monkeypatch.setattr(compilation, "has_setting", lambda config, key: key not in missing and real(config, key))


def test_a_setting_this_torch_lacks_is_skipped_with_one_debug_line(debug_lines, monkeypatch):
    """The policy asks for a setting this torch lacks: the others still apply."""
    torch_without(monkeypatch, "pattern_matcher")
    policy = decide("auto", CUDA, LINUX_TRITON, compile_mode="max-autotune", quantize="int8")
    for _ in range(3):  # read at every compile: logged once
        assert policy.inductor_options == {"coordinate_descent_tuning": True, "max_autotune": True, **PDL}
    assert debug_lines == [f"torch {torch.__version__} has no torch._inductor.config.pattern_matcher: skipped "
                           "(compiles without it)"]


def test_settings_are_found_nested_and_missing_ones_never_raise(debug_lines):
    assert compilation.has_setting(inductor_config, "triton.cudagraphs")
    assert not compilation.has_setting(inductor_config, "triton.no_such_setting")
    assert not compilation.has_setting(inductor_config, "no_such_group.setting")
    wanted = {"triton.no_such_setting": 1, "no_such_setting": 2, "max_autotune": True}
    assert compilation.supported_settings(inductor_config, wanted) == {"max_autotune": True}
    with inductor_config.patch({"max_autotune": False}):  # put back afterwards
        compilation.apply_settings(inductor_config, wanted)
        assert inductor_config.max_autotune is True
    assert len(debug_lines) == 2 and all("skipped" in line for line in debug_lines)
    assert not compilation.has_setting(inductor_config, "max_autotune.no_such_field")


def test_the_recompile_limit_is_raised_never_lowered(monkeypatch, debug_lines):
    with dynamo_config.patch(recompile_limit=8):  # not monkeypatch: see torch_without
        compilation.raise_recompile_limit(32)
        assert dynamo_config.recompile_limit == 32
        compilation.raise_recompile_limit(16)
        assert dynamo_config.recompile_limit == 32
        torch_without(monkeypatch, "recompile_limit")
        compilation.raise_recompile_limit(64)  # a torch without the setting: skipped, no error
        assert dynamo_config.recompile_limit == 32
    assert debug_lines == [f"torch {torch.__version__} has no torch._dynamo.config.recompile_limit: skipped "
                           "(compiles without it)"]


def test_max_autotune_mode_turns_on_inductor_tuning_and_default_mode_does_not():
    policy = decide("auto", CUDA, LINUX_TRITON, compile_mode="max-autotune")
    assert policy.inductor_options == {"coordinate_descent_tuning": True, "max_autotune": True, **PDL}
    assert decide("auto", CUDA, LINUX_TRITON).inductor_options == PDL


def test_int8_weights_turn_off_the_pattern_that_picks_a_slow_int8_matmul_kernel():
    assert decide("auto", CUDA, LINUX_TRITON, quantize="int8").inductor_options == {"pattern_matcher": False, **PDL}
    for mode in ("none", "int4", "fp8"):
        assert decide("auto", CUDA, LINUX_TRITON, quantize=mode).inductor_options == PDL


def test_pdl_can_be_turned_off_and_every_option_is_a_real_inductor_setting(monkeypatch):
    policy = decide("auto", CUDA, LINUX_TRITON, compile_mode="max-autotune", quantize="int8")
    assert "triton.enable_pdl" not in dataclasses.replace(policy, pdl=False).inductor_options
    with inductor_config.patch(policy.inductor_options):  # raises on an unknown setting
        assert inductor_config.max_autotune and not inductor_config.pattern_matcher
        assert inductor_config.triton.enable_pdl if PDL else True
    monkeypatch.setenv("TORCHINDUCTOR_ENABLE_PDL", "0")  # Inductor's own switch is respected
    assert "triton.enable_pdl" not in decide("auto", CUDA, LINUX_TRITON).inductor_options


def test_the_codecs_regions_compile_without_pdl_and_the_decode_steps_with_it():
    """PDL helps the decode step's chains of small kernels; elsewhere it would only cost the first
    start a C compile of Triton's launcher per kernel signature."""
    from engine.runtime.codec_runner import _codec_backend

    policy = decide("auto", CUDA, LINUX_TRITON)
    assert policy.inductor_backend().options == PDL
    assert _codec_backend(policy).options == {}


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_single_row_matmul_equals_mm_and_leaves_batched_rows_alone(weight_dtype):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 64, generator=gen).to(weight_dtype)
    b = torch.randn(64, 48, generator=gen).to(weight_dtype)
    torch.testing.assert_close(single_row_matmul(a, b), a @ b)
    assert single_row_matmul(a, b).dtype == weight_dtype
    assert single_row_matmul(torch.cat([a, a]), b) is NotImplemented


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="Inductor on CPU needs a C++ compiler")
def test_the_inductor_backend_compiles_a_single_row_linear_like_eager():
    policy = decide("auto", CUDA, LINUX_TRITON)
    linear = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(1, 1, 32)
    compiled = torch.compile(linear, fullgraph=True, backend=policy.inductor_backend())
    torch.testing.assert_close(compiled(x), linear(x))


@pytest.fixture
def restored_environ(monkeypatch):
    """configure_caches writes os.environ and sets the compiled regions' store itself: put every
    variable and the store back after the test."""
    import torch._functorch.config as functorch_config

    from engine import compiled_regions

    monkeypatch.setattr(compiled_regions, "_store_root", compiled_regions._store_root)
    with mock.patch.dict(os.environ), functorch_config.patch(bundled_autograd_cache=functorch_config.bundled_autograd_cache):
        yield


def test_caches_go_under_the_cache_dir_unless_set(tmp_path, monkeypatch, restored_environ):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    dirs = compilation.configure_caches(tmp_path / "compile")
    assert dirs["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
    assert dirs["TRITON_CACHE_DIR"] == str(tmp_path / "mine")  # the user's choice wins
    assert os.path.isdir(dirs["TORCHINDUCTOR_CACHE_DIR"])


def test_caches_replace_the_temp_dir_that_importing_dynamo_sets(tmp_path, monkeypatch, restored_environ):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))
    dirs = compilation.configure_caches(tmp_path / "compile")
    assert dirs["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "chosen"))
    assert compilation.configure_caches(tmp_path / "compile")["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "chosen")


def test_caches_pin_inductors_ptxas_so_cold_and_warm_starts_share_triton_keys(tmp_path, monkeypatch,
                                                                               restored_environ):
    """Inductor points Triton at its ptxas only once it compiles (a cold start); configure_caches does
    it up front (Inductor's own helper, whatever its torch version looks for), so that our kernels'
    cache keys are the same on a warm start."""
    from torch._inductor.runtime import compile_tasks

    root = tmp_path / "torch"
    monkeypatch.setattr(compile_tasks, "__file__", str(root / "_inductor" / "runtime" / "compile_tasks.py"))
    for folder in (root / "bin", root / "_inductor" / "bin"):  # where torch versions have kept it
        folder.mkdir(parents=True)
        (folder / "ptxas").write_text("#!/bin/sh\n")
        (folder / "ptxas").chmod(0o755)
    clear = getattr(compile_tasks._set_triton_ptxas_path, "cache_clear", lambda: None)
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    clear()
    try:
        compilation.configure_caches(tmp_path / "compile")
        assert Path(os.environ["TRITON_PTXAS_PATH"]).is_relative_to(root)
        os.environ["TRITON_PTXAS_PATH"] = "/opt/cuda/bin/ptxas"  # the user's choice wins
        clear()
        compilation.configure_caches(tmp_path / "compile")
        assert os.environ["TRITON_PTXAS_PATH"] == "/opt/cuda/bin/ptxas"
    finally:
        clear()  # torch's helper caches that it ran: let the next caller look again


@pytest.mark.gpu
def test_a_warm_start_neither_compiles_nor_traces_again(tmp_path):
    """Two starts of the demo engine on one cache dir (benchmark.py's start-up phase): the second loads
    every Triton kernel, ours included, and compiles none, and installs every compiled region's graphs
    without tracing one (compiled_regions). Our kernels' cache keys depend on the ptxas
    Triton uses, which Inductor sets only once it compiles something: configure_caches pins it, or a
    first restart would compile them all again."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_PTXAS_PATH")}
    cache = tmp_path / "cache"

    def start() -> tuple[dict, set[str]]:
        run = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--phase", "startup", "--cache-dir", str(cache),
             "--weights", "demo", "--device", "cuda", "--precision", "auto", "--compile", "on", "--compile-mode",
             "default", "--quantize", "none", "--max-batch-size", "1"],
            capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        traced = json.loads(run.stdout.strip().splitlines()[-1])["compiled_functions"]
        # Triton makes a key's folder on every lookup, hit or miss: count the compiled kernels.
        return traced, {str(cubin.relative_to(cache)) for cubin in (cache / "compile" / "triton").glob("*/*.cubin")}

    traced, cold = start()
    assert cold and traced  # the engine cached its kernels under its cache dir
    traced_again, warm = start()
    assert not warm - cold, f"the warm start compiled {sorted(warm - cold)}"
    assert traced_again == {}, f"the warm start traced {traced_again} again (the compiled regions' store)"



# A start of the demo engine (two KV slots) on the cache dir argv[2], compile helpers on or off
# (argv[3]), every graph captured, then one request. Prints its audio's digest and the functions this process traced.
START_AND_SPEAK = """
import hashlib, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/scripts"]
from benchmark_phases import compiled_functions, keep_every_compile_record
from engine.config import EngineConfig
from engine.facade import TTSEngine
from engine.params import SamplingParams
keep_every_compile_record()
engine = TTSEngine.from_config(EngineConfig(demo=True, device="cuda", compile="on", max_batch_size=2,
                                            cache_dir=sys.argv[2], compile_helpers=sys.argv[3] == "on"))
engine.prepare()
engine.capture_all()
audio = engine.synthesize("Hello there, one two three.", params=SamplingParams(max_new_tokens=64, seed=0)).audio
engine.close()
print(json.dumps({"audio": hashlib.sha256(audio.tobytes()).hexdigest(), "traced": sorted(compiled_functions())}))
"""


@pytest.mark.gpu
def test_compile_helpers_compile_what_the_engine_then_installs(tmp_path):
    """A first start with compile helpers (engine/compile_helpers.py): both helpers end well, the
    engine traces none of their regions (it installs the packages they saved), speaks as an engine
    that compiled everything itself, and a restart traces nothing."""
    if compile_helpers.usable_cpus() < compile_helpers.MIN_CPUS:
        pytest.skip(f"compile helpers need {compile_helpers.MIN_CPUS} CPUs")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_PTXAS_PATH")}

    def start(cache: str, helpers: str) -> tuple[dict, str]:
        run = subprocess.run([sys.executable, "-c", START_AND_SPEAK, str(ROOT), str(tmp_path / cache), helpers],
                             capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr

    first, log = start("helped", "on")
    for part in compile_helpers.PARTS:
        assert f"the compile helper of the {part} graphs ended" in log, log[-3000:]
    theirs = {fn.__name__ for functions in compile_helpers.PARTS.values() for fn in functions}
    assert first["traced"] and not theirs & set(first["traced"]), first["traced"]
    alone, log = start("alone", "off")
    assert "helper processes" not in log and theirs <= set(alone["traced"])
    assert first["audio"] == alone["audio"]
    again, log = start("helped", "on")
    assert "helper processes" not in log and again == {"audio": first["audio"], "traced": []}


def test_quantized_weights_keep_the_compiled_regions_out_of_the_store():
    """A stored graph's guards pickle its inputs' metadata, which torchao's tensors cannot give."""
    assert decide("auto", CUDA, LINUX_TRITON).inductor_backend().store_key
    for mode in ("int8", "int4", "fp8"):
        assert decide("auto", CUDA, LINUX_TRITON, quantize=mode).inductor_backend().store_key is None

# A region compiled with the engine's backend, in a process of its own; prints Inductor's counters.
COMPILE_ONE_REGION = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from torch._dynamo.utils import counters
from engine import compilation
from engine.compilation import CompilePolicy
if len(sys.argv) > 2:  # stands in for a changed single_row_matmul
    compilation._decomposition_version = lambda: sys.argv[2]
compilation.tag_compile_caches()
linear = torch.nn.Linear(32, 32)
region = torch.compile(lambda x: torch.relu(linear(x)), backend=CompilePolicy(True, False, "test").inductor_backend(),
                       fullgraph=True)
with torch.inference_mode():
    region(torch.randn(3, 32))
print(json.dumps(dict(counters["inductor"])))
"""


@pytest.mark.skipif(torch.__version__.startswith("2.12."),
                    reason="torch 2.12 wraps the decomposition table in a closure that never pickles: no FX graph cache")
def test_the_next_start_loads_a_region_compiled_with_the_engines_backend_from_inductors_cache(tmp_path):
    """From torch 2.13 the decomposition table is part of the FX graph cache's key: a table that does
    not pickle made every compile bypass the cache, and each start compiled every graph again. A
    changed decomposition misses (the cache key tag)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")

    def start(*decomposition_version: str) -> dict:
        run = subprocess.run([sys.executable, "-c", COMPILE_ONE_REGION, str(ROOT), *decomposition_version],
                             capture_output=True, text=True, timeout=600, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    cold, warm = start(), start()
    assert cold.get("fxgraph_cache_miss") and not cold.get("fxgraph_cache_bypass"), cold
    assert warm.get("fxgraph_cache_hit") and not warm.get("fxgraph_cache_miss"), warm
    changed = start("another decomposition")
    assert changed.get("fxgraph_cache_miss") and not changed.get("fxgraph_cache_hit"), changed


def test_the_decomposition_table_pickles_as_a_rebuild():
    table = compilation.DecompositionTable()
    assert table[torch.ops.aten.mm.default] is single_row_matmul and len(table) > 100
    assert pickle.loads(pickle.dumps(table)) == table


def test_the_cache_key_tag_names_the_decompositions_beside_the_users_tag(monkeypatch):
    import torch.compiler.config as compiler_config

    ours = f"s1-mini-decompositions-{compilation._decomposition_version()}"
    with compiler_config.patch(cache_key_tag="users-tag"):
        compilation.tag_compile_caches()
        compilation.tag_compile_caches()  # once, however often the engine starts
        assert compiler_config.cache_key_tag == f"users-tag+{ours}"
        monkeypatch.setattr(compilation, "_decomposition_version", lambda: "changed")
        compilation.tag_compile_caches()
        assert compiler_config.cache_key_tag == "users-tag+s1-mini-decompositions-changed"


def test_environment_detection_reports_this_machine():
    env = Environment.detect()
    assert env.torch == torch.__version__ and env.cuda == torch.cuda.is_available()


def test_kv_buckets_cover_every_length_up_to_capacity():
    sizes = buckets_up_to(4096, 256)
    assert sizes == [256, 512, 1024, 2048, 4096]
    assert buckets_up_to(2560, 256)[-1] == 2560
    assert [bucket_for(n, sizes) for n in (1, 256, 257, 4096)] == [256, 256, 512, 4096]
    with pytest.raises(ValueError):
        bucket_for(4097, sizes)


# The engine's compiled residual sum (codec_streamers.compiled_pointwise) in a process of its own,
# with its regions stored under argv[2]; argv[3]: how many of the calls below to make (the last one
# is a dtype no earlier call had); with argv[4], the function compiled with another backend after.
# Prints the graphs Dynamo traced and the marks left on an input.
START_WITH_STORED_REGIONS = """
import json, sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from torch._dynamo.utils import counters
from engine import compiled_regions
from engine.compilation import CompilePolicy
from engine.model.codec_convs import biased_residual
from engine.model.codec_streamers import compiled_pointwise
compiled_regions.use_store(Path(sys.argv[2]))
ops = compiled_pointwise(CompilePolicy(True, False, "test", pdl=False).inductor_backend())
gen = torch.Generator().manual_seed(0)
calls = [(1, 8, 5, torch.float32), (3, 8, 5, torch.float32), (2, 16, 7, torch.float32), (3, 8, 5, torch.float64)]
with torch.inference_mode():
    for rows, channels, steps, dtype in calls[: int(sys.argv[3])]:
        x, y = (torch.randn(rows, channels, steps, generator=gen, dtype=dtype) for _ in range(2))
        bias = torch.randn(channels, generator=gen, dtype=dtype)
        torch.testing.assert_close(ops.biased_residual(x, y, bias), biased_residual(x, y, bias), rtol=0, atol=0)
result = {"graphs": counters["stats"]["unique_graphs"],
          "marks": [m for m in compiled_regions.DIMENSION_MARKS if hasattr(x, m)]}
if len(sys.argv) > 4:  # the same function compiled with another backend
    from torch._dynamo.testing import CompileCounter
    counter = CompileCounter()
    with torch.inference_mode():
        compiled_regions.compile_region(biased_residual, counter)(x, y, bias)
    result["other_backend_graphs"] = counter.frame_count
print(json.dumps(result))
"""


def test_a_restart_runs_the_stored_regions_without_tracing_them_again(tmp_path):
    """Dynamo traces every compiled region again at each start, even when Inductor's cache holds its
    graphs; the region store saves them whole. A second start traces nothing (its calls unmarked,
    the saved guards take no dimension marks); a call no stored graph takes compiles one, which the
    next start loads too; a store file that does not load makes the region trace again. The stored
    graphs serve no compile of the function with another backend."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    store = tmp_path / "regions"

    def start(calls: int, *other_backend: str) -> dict:
        run = subprocess.run([sys.executable, "-c", START_WITH_STORED_REGIONS, str(ROOT), str(store), str(calls),
                              *other_backend],
                             capture_output=True, text=True, timeout=600, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    assert start(3)["graphs"] == 2  # one row, and every row count, channel count and length above it
    assert start(3) == {"graphs": 0, "marks": []}
    assert start(4) == {"graphs": 1, "marks": []}  # float64: compiled and stored beside the others
    assert start(4) == {"graphs": 0, "marks": []}
    assert start(4, "other backend")["other_backend_graphs"] == 1
    [entry] = store.glob("*biased_residual*/entry")
    entry.write_bytes(b"not a package")
    assert start(4)["graphs"] == 3
    assert start(4)["graphs"] == 0


# The codec's compiled transformer layers, streamed as the engine streams them (the attention
# backends chosen around the calls), in a process of its own with its regions stored under argv[2].
# Prints the graphs Dynamo traced.
START_WITH_STORED_CODEC_LAYERS = """
import dataclasses, json, sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from torch._dynamo.utils import counters
from engine import compiled_regions
from engine.compilation import CompilePolicy
from engine.model.codec_config import CodecConfig
from engine.model.codec_streamers import compiled_layer_forward, streamer_for
from engine.model.codec_transformer import WindowLimitedTransformer
compiled_regions.use_store(Path(sys.argv[2]))
cfg = dataclasses.replace(CodecConfig.s1_mini().quantizer_transformer, dim=64, n_head=4, n_local_heads=4,
                          head_dim=16, intermediate_size=128, window_size=8, block_size=64)
torch.manual_seed(0)
transformer = WindowLimitedTransformer(cfg, 2)
for p in transformer.parameters():
    torch.nn.init.normal_(p, std=0.02)
transformer.stream_layers_with(compiled_layer_forward(CompilePolicy(True, False, "test", pdl=False).inductor_backend()))
streamer = streamer_for(transformer, 3, cfg.rope_base)
with torch.inference_mode():
    for steps in (4, 4, 6):
        streamer.step(torch.randn(3, cfg.dim, steps), None)
print(json.dumps({"graphs": counters["stats"]["unique_graphs"]}))
"""


def test_a_restart_runs_the_stored_codec_layers_without_tracing_them_again(tmp_path):
    """The codec's layers choose their attention backends around the compiled layer_forward: chosen
    inside it, Dynamo traced it at every start, its graphs never stored (18 s of a restart on an H100)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")

    def start() -> int:
        run = subprocess.run([sys.executable, "-c", START_WITH_STORED_CODEC_LAYERS, str(ROOT), str(tmp_path / "regions")],
                             capture_output=True, text=True, timeout=600, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])["graphs"]

    assert start() == 1  # every row count and chunk length of more than one
    assert start() == 0


def test_a_region_whose_compile_fails_for_the_store_compiles_without_it(tmp_path, monkeypatch, debug_lines):
    """A graph the store cannot hold fails its compile (its guards are pickled as it compiles; a
    tensor subclass's may not pickle): the region compiles again without the store, and runs."""
    from engine import compiled_regions
    from engine.model.codec_convs import biased_residual

    def unpicklable(entries):
        raise TypeError("these guards do not pickle")

    monkeypatch.setattr(compiled_regions, "_store_root", tmp_path)
    monkeypatch.setattr(compiled_regions, "_regions", {})
    monkeypatch.setattr(compiled_regions, "_serializable_guards", unpicklable)
    torch._dynamo.reset()
    backend = compilation.CompilePolicy(True, False, "test", pdl=False).inductor_backend()
    region = compiled_regions.compile_region(biased_residual, backend)
    x, y, bias = torch.randn(2, 4, 3), torch.randn(2, 4, 3), torch.randn(4)
    with torch.inference_mode():
        torch.testing.assert_close(region(x, y, bias), biased_residual(x, y, bias), rtol=0, atol=0)
        torch.testing.assert_close(region(y, x, bias), biased_residual(y, x, bias), rtol=0, atol=0)
    assert [line for line in debug_lines if "compiling it without" in line]
    assert not list(tmp_path.rglob("entry"))
