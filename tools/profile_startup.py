#!/usr/bin/env python
"""Where a start-up's time goes: the benchmark's start-up phase (process start to the first audio,
then every batch's graphs) run under py-spy, a cold start on a fresh compile cache and then
--restarts warm ones on the same cache, each summarised by what its threads were doing.

    python tools/profile_startup.py --weights random [--restarts 1] [--rate 50] [--keep DIR] [--json out.json]
                                    [--compile-helpers off]

For each start: the phase's own figures (scripts/benchmark_phases.py: to_first_audio_s,
compile_s, ...) and, per thread (the GPU worker does every compile and capture; the main thread
imports and loads), the sampled seconds by stage (STAGES: our Triton kernels compiled on first
launch, Triton's C launchers built with a C compiler, Inductor's codegen, AOTAutograd, Dynamo, the
compile pool, CUDA graph capture, ...), and the worker's sampled seconds per compiled region, named
by the engine code that called it. py-spy samples without stopping the process (--nonblocking), so
its seconds are shares of the sampled time: compare them with each other, and the run's wall time
with the phase's figures. --keep DIR keeps py-spy's raw samples (flamegraph.pl reads them). A
cold start's compile helpers (engine/compile_helpers.py) run in processes of their own, which py-spy
does not sample: --compile-helpers off profiles a cold start whose engine compiles everything.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts")]  # the benchmark's start-up environment and the weight options
from benchmark import startup_env  # noqa: E402
from weight_options import add_weight_options, parse_with_weights  # noqa: E402

# A sample belongs to the first stage one of whose markers is in one of its frames' function names.
STAGES = (
    ("triton launcher build (C compiler)", ("CudaLauncher.__init__",)),
    ("our triton kernels compiled", ("JITFunction._do_compile",)),
    ("inductor kernels loaded", ("CachingAutotuner.precompile",)),
    ("inductor autotuning", ("benchmark_all_configs", "autotune_to_one_config")),
    ("waiting for the compile pool", ("AsyncCompile.wait",)),
    ("inductor codegen", ("fx_codegen_and_compile", "compile_fx_inner")),
    ("compiled code's first runs", ("call_func_at_runtime_with_args",)),
    ("aotautograd", ("create_aot_dispatcher_function", "aot_module_simplified")),
    ("dynamo guards", ("CheckFunctionManager",)),
    ("dynamo tracing", ("InstructionTranslator", "convert_frame")),
    ("stored regions installed", ("CompilePackage.install", "load_package")),
    ("cuda graph capture", ("CUDAGraph.capture_end", "CUDAGraph.capture_begin")),
    ("imports", ("_find_and_load",)),
    ("waiting for the worker", ("Job.results",)),
)
REGION_CALL = "_StoredRegion.__call__"
SHOWN_THREADS = ("MainThread", "s1-gpu-worker")  # imports and loading; every compile and capture


def frame_name(frame: str) -> str:
    """py-spy's `function (file:line)` as the function's name."""
    return frame.split(" (", 1)[0]


def summarise(raw: str, rate: float) -> dict:
    """py-spy's raw samples (`thread (id): name;frame;...;frame count` per line, with --threads) ->
    per thread, the sampled seconds in all and by stage; and the seconds under each compiled
    region, by the two engine functions that called it (`caller's caller > caller`)."""
    threads: dict = {}
    regions: collections.Counter = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = re.sub(r"^thread \([^)]*\):? ?", "", frames[0]) or frames[0]
        names = [frame_name(f) for f in frames[1:]]
        seconds = int(count) / rate
        entry = threads.setdefault(thread, {"sampled_s": 0.0, "stages": collections.Counter()})
        entry["sampled_s"] += seconds
        stage = next((name for name, markers in STAGES if any(m in n for n in names for m in markers)), "other")
        entry["stages"][stage] += seconds
        if REGION_CALL in names:
            at = names.index(REGION_CALL)
            regions[" > ".join(names[max(0, at - 2):at])] += seconds
    return {"threads": {t: {"sampled_s": round(e["sampled_s"], 2),
                            "stages": {k: round(v, 2) for k, v in e["stages"].most_common()}}
                        for t, e in sorted(threads.items(), key=lambda item: -item[1]["sampled_s"])},
            "regions_by_caller": {k: round(v, 2) for k, v in regions.most_common()}}


def find_py_spy() -> str | None:
    """py-spy on PATH or beside this Python (a venv's bin, not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def py_spy() -> str:
    found = find_py_spy()
    if found is None:
        sys.exit("py-spy not found: pip install py-spy (requirements-dev.txt brings it with ray)")
    return found


def profile_start(start_argv: list[str], cache_dir: str, env: dict, raw_path: Path, rate: float) -> dict:
    """One start-up phase under py-spy: the phase's JSON result plus the summary of its samples."""
    command = [py_spy(), "record", "--threads", "--idle", "--nonblocking", "--rate", str(rate), "--format", "raw",
               "--output", str(raw_path), "--", sys.executable, str(ROOT / "scripts" / "benchmark.py"),
               "--phase", "startup", "--cache-dir", cache_dir, *start_argv]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    results = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not results or not raw_path.is_file():
        sys.exit(f"the profiled start failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return {"phase": json.loads(results[-1]), **summarise(raw_path.read_text(), rate)}


def print_start(label: str, start: dict) -> None:
    phase = start["phase"]
    print(f"\n{label}: first audio after {phase['to_first_audio_s']:.1f} s, compile and capture "
          f"{phase['compile_s']:.1f} s, every graph after {phase['to_all_graphs_s']:.1f} s")
    # py-spy samples idle threads too (--idle: the worker's waits are part of the start-up's time),
    # the engine's other threads among them: only these two do start-up work.
    for thread, entry in start["threads"].items():
        if thread not in SHOWN_THREADS:
            continue
        print(f"  {thread}: {entry['sampled_s']:.1f} s sampled")
        for stage, seconds in entry["stages"].items():
            print(f"    {seconds:7.1f} s  {stage}")
    if start["regions_by_caller"]:
        print("  compiled regions, by caller:")
        for caller, seconds in list(start["regions_by_caller"].items())[:10]:
            print(f"    {seconds:7.1f} s  {caller}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--restarts", type=int, default=1, help="warm starts after the cold one")
    p.add_argument("--rate", type=float, default=50, help="py-spy samples a second")
    p.add_argument("--keep", type=Path, help="keep py-spy's raw samples here (cold.txt, restart1.txt, ...)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--compile-helpers", default="on", choices=["on", "off"],
                   help="the cold start's compile helper processes (not sampled)")
    args = parse_with_weights(p, argv)
    start_argv = ["--weights", args.weights, *(["--checkpoint", args.checkpoint] if args.checkpoint else []),
                   "--compile-helpers", args.compile_helpers]
    work = Path(tempfile.mkdtemp(prefix="profile-startup-"))
    raw_dir = args.keep or work
    raw_dir.mkdir(parents=True, exist_ok=True)
    env = startup_env(str(work / "pycache"))
    starts = {}
    for label in ["cold", *(f"restart{i}" for i in range(1, args.restarts + 1))]:
        starts[label] = profile_start(start_argv, str(work / "compile-cache"), env, raw_dir / f"{label}.txt",
                                      args.rate)
        print_start(label, starts[label])
    if args.json:
        args.json.write_text(json.dumps(starts, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
