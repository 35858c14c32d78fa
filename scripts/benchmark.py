#!/usr/bin/env python
"""Benchmark the engine and write JSON (stable keys) plus an HTML report with plots.

    python scripts/benchmark.py --weights random --json out/bench.json --html out/bench.html
    python scripts/benchmark.py --weights random --compare compile=off      # a second config side by side
    python scripts/benchmark.py --checkpoint checkpoints/openaudio-s1-mini  # the real weights

Measures, per configuration: single-stream decode frames/s and real-time factor (prompt of about
--prompt-positions positions, --frames frames), prefill time, time to first audio while streaming,
codec decode time per audio second, cold compile and warm restart (fresh processes sharing a fresh
compile cache; with the seconds each spent in torch.compile's main stages), memory after load and
at peak (each configuration in a process of its own: a closed engine's compiled graphs keep device
memory that would count against the next one), and end-to-end
latency percentiles over --requests requests of two kinds: a short text, and a voice clone with a
10 s reference; then a concurrency sweep (continuous batching, in process, codec included): at each
level, that many streams at once, each a ~10 s request (unique texts; half of them clone one of two
voices), with aggregate audio-seconds per second, time to first audio and per-request real-time
factor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# This script's folder: its parts, and the options and reports it shares with the other scripts.
from benchmark_phases import measure_in_process, startup_phase  # noqa: E402
from benchmark_report import print_table, write_html  # noqa: E402
from reports import environment, write_reports  # noqa: E402
from weight_options import add_weight_options, parse_with_weights  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--compile-mode", default="default", choices=["default", "max-autotune"])
    p.add_argument("--quantize", default="none")
    p.add_argument("--compile-helpers", default="on", choices=["on", "off"],
                   help="on a first start, helper processes compile parts of the graphs (engine/compile_helpers.py)")
    p.add_argument("--max-batch-size", type=int, default=0,
                   help="KV slots (concurrent sequences) of the engine; 0 = the engine's auto choice (64 on CUDA)")
    p.add_argument("--concurrency", default="1,4,16,64",
                   help="concurrency levels of the in-process sweep (comma-separated; empty to skip)")
    p.add_argument("--sweep-requests", type=int, default=2, help="requests per stream at each concurrency level")
    p.add_argument("--frames", type=int, default=400, help="frames per single-stream decode run")
    p.add_argument("--prompt-positions", type=int, default=280)
    p.add_argument("--runs", type=int, default=3, help="single-stream decode runs (the median is reported)")
    p.add_argument("--requests", type=int, default=10, help="requests per latency kind")
    p.add_argument("--request-frames", type=int, default=215, help="frame budget per latency request (~10 s)")
    p.add_argument("--compare", action="append", default=[], type=compare_spec,
                   help="a second configuration as key=value[,key=value] over the first (e.g. compile=off); keys: "
                   + ", ".join(COMPARE_KEYS))
    p.add_argument("--skip-startup", action="store_true", help="skip the cold-compile / warm-restart processes")
    p.add_argument("--json", type=Path, help="write results here")
    p.add_argument("--html", type=Path, help="write an HTML report with plots here")
    p.add_argument("--phase", choices=["startup", "measure"],
                   help="one part in this process, printed as one JSON line (the benchmark runs each part in a "
                   "process of its own): startup = import, load, compile, first audio, every graph; measure = the "
                   "in-process measurements")
    p.add_argument("--cache-dir", help="with --phase startup: the compile cache it starts on (run it twice on one "
                   "fresh dir: a first start, then a restart)")
    return parse_with_weights(p, argv)


def measure_startup(settings: dict) -> dict:
    cache_dir = tempfile.mkdtemp(prefix="bench-compile-cache-")
    env = startup_env(tempfile.mkdtemp(prefix="bench-pycache-"))
    runs = []
    for _ in ("cold", "warm"):
        runs.append(run_phase(["--phase", "startup", "--cache-dir", cache_dir, *settings_to_argv(settings)],
                              "start-up run", timeout=1800, env=env, stderr=subprocess.PIPE))
    cold, warm = runs
    return {"cold_compile_s": cold["compile_s"], "cold_first_request_compile_s": cold["first_request_compile_s"],
            "cold_to_first_audio_s": cold["to_first_audio_s"], "cold_to_all_graphs_s": cold["to_all_graphs_s"],
            "warm_compile_s": warm["compile_s"], "warm_restart_s": warm["to_first_audio_s"],
            "warm_to_all_graphs_s": warm["to_all_graphs_s"],
            "load_s": warm["load_s"], "import_and_cuda_init_s": warm["import_and_cuda_init_s"],
            "cold_torch_compile_s": cold.get("torch_compile_s", {}), "warm_torch_compile_s": warm.get("torch_compile_s", {}),
            "cold_compiled_functions": cold.get("compiled_functions", {}),
            "warm_compiled_functions": warm.get("compiled_functions", {})}


def startup_env(pycache_dir: str) -> dict:
    """This process's environment for the start-up runs: without the compile-cache locations that
    the in-process engine set (the runs use their own fresh cache: a truly cold first compile), and
    with Python's bytecode cache on, in a fresh folder. An installed Python has bytecode (pip writes
    it at install time); an environment without it (PYTHONDONTWRITEBYTECODE, as on our GPU machine's
    image) compiles the source of ~2,300 modules at every start, ~9 s of a warm restart there."""
    drop = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPYCACHEPREFIX": pycache_dir}


SETTINGS = ("weights", "device", "precision", "compile", "compile_mode", "quantize", "max_batch_size", "compile_helpers")
COMPARE_KEYS = ("checkpoint", *SETTINGS)  # what a compared configuration may change (settings_to_argv passes on)


def compare_spec(spec: str) -> tuple[str, dict]:
    """--compare's key=value[,key=value] as (the spec, its settings); keys as the options are named,
    with _ or -. An unknown key is an error: the base configuration would be measured again under
    the spec's name."""
    changes = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in COMPARE_KEYS:
            raise argparse.ArgumentTypeError(f"{item!r}: expected KEY=VALUE with KEY one of " + ", ".join(COMPARE_KEYS))
        changes[key] = value.strip()
    return spec, changes


def _option(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def settings_to_argv(settings: dict) -> list[str]:
    argv = []
    for key in SETTINGS:
        argv += [_option(key), str(settings[key])]
    if settings.get("checkpoint"):
        argv += ["--checkpoint", settings["checkpoint"]]
    return argv


def measure_configuration(settings: dict, argv: list[str]) -> dict:
    """measure_in_process in a fresh process: after an engine closes, its compiled graphs and their
    memory pools stay in the process, and a configuration measured after another would report more
    memory after load than alone."""
    replaced = ("--compare", "--json", "--html", "--checkpoint", *map(_option, SETTINGS))
    return run_phase([*_without_options(argv, replaced), *settings_to_argv(settings), "--phase", "measure"],
                     f"measuring {settings}", timeout=3600)


def run_phase(args: list[str], what: str, timeout: float, **popen) -> dict:
    """This script in a fresh process with `args` (one --phase); its last line of output is its JSON
    result. The child's log goes to the console unless popen captures stderr (then it is in the error)."""
    out = subprocess.run([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, timeout=timeout, **popen)
    if out.returncode != 0:
        log = f":\n{out.stderr[-4000:]}" if out.stderr is not None else " (its log is above)"
        raise RuntimeError(f"{what} failed{log}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _without_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """argv without the named options and their values (as `--name value` or `--name=value`)."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in names:
            skip = True
        elif not item.startswith(tuple(f"{n}=" for n in names)):
            kept.append(item)
    return kept


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    base = {k: getattr(args, k) for k in ("checkpoint", *SETTINGS)}
    if args.phase == "startup":
        print(json.dumps(startup_phase(base, args.cache_dir)))
        return 0
    if args.phase == "measure":
        print(json.dumps(measure_in_process(base, args)))
        return 0
    configs = [("base", base)]
    for spec, changes in args.compare:
        configs.append((spec, {**base, **changes}))
    results = []
    for name, settings in configs:
        result = {"name": name, "settings": settings, **measure_configuration(settings, argv)}
        if not args.skip_startup:
            result["startup"] = measure_startup(settings)
        results.append(result)
    first = results[0]
    env = environment()
    report = {"environment": env,
              **{k: first[k] for k in ("single_stream", "codec", "latency_ms", "memory", "concurrency")},
              "startup": first.get("startup", {}), "device": env["device"],
              "torch": env["torch"], "commit": env["commit"], "configurations": results}
    print_table(results)
    write_reports(report, args.json, args.html, write_html)
    return 0


if __name__ == "__main__":
    sys.exit(main())
