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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402  (this script's folder)

FRAMES_PER_AUDIO_SECOND = 44100 / 2048
SHORT_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--compile-mode", default="default", choices=["default", "max-autotune"])
    p.add_argument("--quantize", default="none")
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
    p.add_argument("--compare", action="append", default=[],
                   help="a second configuration as key=value[,key=value] over the first (e.g. compile=off)")
    p.add_argument("--skip-startup", action="store_true", help="skip the cold-compile / warm-restart processes")
    p.add_argument("--json", type=Path, help="write results here")
    p.add_argument("--html", type=Path, help="write an HTML report with plots here")
    p.add_argument("--phase", choices=["startup", "measure"], help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    return parse_with_weights(p, argv)


def engine_config(settings: dict, cache_dir: str | None = None):
    from engine.config import EngineConfig

    return EngineConfig(
        **weight_config(settings["weights"], settings.get("checkpoint")),
        device=settings["device"], precision=settings["precision"], compile=settings["compile"],
        quantize=settings["quantize"], cache_dir=cache_dir, max_batch_size=int(settings.get("max_batch_size", 1)),
        compile_mode=settings.get("compile_mode", "default"),
        voices_dir=tempfile.mkdtemp(prefix="bench-voices-"), max_text_length=0,
    )


# ---- one process: start-up timing --------------------------------------------------------------------


def startup_phase(settings: dict, cache_dir: str) -> dict:
    """Process start -> engine loaded -> one request's graphs compiled and captured -> first streamed
    audio; then the larger batches' graphs (which a server captures after it is ready)."""
    started = time.perf_counter()
    import torch

    from engine.facade import TTSEngine
    from engine.params import SamplingParams

    if torch.cuda.is_available():
        torch.cuda.init()
    imported = time.perf_counter()
    engine = TTSEngine.from_config(engine_config(settings, cache_dir))
    loaded = time.perf_counter()
    prepare_s = engine.prepare()
    prepared = time.perf_counter()
    next(iter(engine.synthesize_stream("Hello there.", params=SamplingParams(max_new_tokens=16, seed=0))))
    first_audio = time.perf_counter()
    rest_s = engine.capture_all()
    all_graphs = time.perf_counter()
    engine.close()
    return {"import_and_cuda_init_s": imported - started, "load_s": loaded - started,
            "compile_s": prepare_s + rest_s, "first_request_compile_s": prepare_s,
            "prepare_wall_s": prepared - loaded, "to_first_audio_s": first_audio - started,
            "to_all_graphs_s": all_graphs - started, "torch_compile_s": torch_compile_stages()}


# Stages of torch.compile that Dynamo times (its own names), and ours for them.
COMPILE_STAGES = {"_compile.compile_inner": "all", "bytecode_tracing": "dynamo_tracing",
                  "fx_codegen_and_compile": "inductor", "async_compile.wait": "waiting_for_triton",
                  "PyCodeCache.load_by_key_path": "loading_modules"}


def torch_compile_stages() -> dict:
    """Seconds this process spent in the main stages of torch.compile, from Dynamo's own timers (a
    private API: {} where it is missing or has changed)."""
    try:
        from torch._dynamo.utils import compile_times

        headers, values = compile_times(repr="csv", aggregate=True)
        return {COMPILE_STAGES[h]: round(float(v), 3) for h, v in zip(headers, values, strict=True) if h in COMPILE_STAGES}
    except Exception as exc:  # a benchmark's side detail: reported, never worth failing the run
        return {"unavailable": f"{type(exc).__name__}: {exc}"}


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
            "cold_torch_compile_s": cold.get("torch_compile_s", {}), "warm_torch_compile_s": warm.get("torch_compile_s", {})}


def startup_env(pycache_dir: str) -> dict:
    """This process's environment for the start-up runs: without the compile-cache locations that
    the in-process engine set (the runs use their own fresh cache: a truly cold first compile), and
    with Python's bytecode cache on, in a fresh folder. An installed Python has bytecode (pip writes
    it at install time); an environment without it (PYTHONDONTWRITEBYTECODE, as on our GPU machine's
    image) compiles the source of ~2,300 modules at every start, ~9 s of a warm restart there."""
    drop = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPYCACHEPREFIX": pycache_dir}


SETTINGS = ("weights", "device", "precision", "compile", "compile_mode", "quantize", "max_batch_size")


def _option(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def settings_to_argv(settings: dict) -> list[str]:
    argv = []
    for key in SETTINGS:
        argv += [_option(key), str(settings[key])]
    if settings.get("checkpoint"):
        argv += ["--checkpoint", settings["checkpoint"]]
    return argv


# ---- in-process measurements ------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)),
            "p99": float(np.percentile(arr, 99)), "mean": float(arr.mean()), "n": len(values)}


def underrun_seconds(arrivals: list[tuple[float, float]]) -> float:
    """How long a listener who starts playing at the first audio waits for audio that has not come:
    arrivals are (arrival time s, audio s) per chunk, in order."""
    stalled, runs_out = 0.0, arrivals[0][0] if arrivals else 0.0
    for at, seconds in arrivals:
        if at > runs_out:
            stalled += at - runs_out
            runs_out = at
        runs_out += seconds
    return stalled


def stream_record(started: float, arrivals: list[tuple[float, float]]) -> dict:
    """One streamed request, from its start and its chunks' (arrival time s, audio s): time to first
    audio, real-time factor and underrun (None where it produced no audio)."""
    total = time.perf_counter() - started
    audio_s = sum(seconds for _, seconds in arrivals)
    return {"ttfa_ms": (arrivals[0][0] - started) * 1000 if arrivals else None, "total_s": total,
            "audio_s": audio_s, "rtf": total / audio_s if audio_s else None, "underrun_s": underrun_seconds(arrivals)}


def level_summary(ok: list[dict]) -> dict:
    """Percentiles over the stream_records of the requests that produced audio ({} when none did)."""
    if not ok:
        return {}
    ttfa, rtf = percentiles([r["ttfa_ms"] for r in ok]), percentiles([r["rtf"] for r in ok])
    slowest = max(ok, key=lambda r: r["rtf"])
    # rtf_max_audio_s: a request of less audio than the first-audio wait under load is slower than real
    # time whatever the engine's speed (with random weights a few end after a few frames)
    return {"ttfa_ms_p50": ttfa["p50"], "ttfa_ms_p95": ttfa["p95"], "rtf_p50": rtf["p50"],
            "rtf_max": slowest["rtf"], "rtf_max_audio_s": slowest["audio_s"],
            "faster_than_real_time": sum(r["rtf"] < 1 for r in ok),
            "underrun_s_max": max(r["underrun_s"] for r in ok),
            "streams_with_underrun": sum(r["underrun_s"] > 0.01 for r in ok)}


def synthetic_prompt(engine, positions: int):
    """A realistic prompt: interleave + speaker tag + text tokens, padded with reference-like frames."""
    import torch

    from engine.text.prompt import build_prompt

    tok = engine.models.tokenizer
    text_prompt = build_prompt(tok, SHORT_TEXT * 4, [])
    if text_prompt.shape[1] >= positions:
        return text_prompt[:, :positions]
    frames = positions - text_prompt.shape[1] - 4
    gen = torch.Generator().manual_seed(0)
    codes = torch.cat([torch.randint(0, 4096, (1, frames), generator=gen),
                       torch.randint(0, 1024, (9, frames), generator=gen)])
    prompt = build_prompt(tok, SHORT_TEXT * 4, [("reference words", codes)])
    return prompt[:, :positions]


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_in_process(settings: dict, args) -> dict:
    import numpy as np
    import torch

    from engine.facade import ReferenceInput, TTSEngine
    from engine.params import SamplingParams
    from engine.runtime.scheduler import SequenceSpec

    engine = TTSEngine.from_config(engine_config(settings))
    device = engine.models.placement.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    after_load = engine.stats()["memory_gb"]
    engine.warmup()
    engine.capture_all()  # every batch bucket's graphs, for the concurrency sweep
    after_warmup = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    runner = engine._core.runner
    loop = engine._core.decode_loop
    prompt = synthetic_prompt(engine, args.prompt_positions).to(device)

    def decode_run(seed):
        """(prefill seconds, decode seconds for args.frames frames) of one sequence alone."""
        sync(device)
        t0 = time.perf_counter()
        runner.prefill(0, prompt)
        sync(device)
        t1 = time.perf_counter()
        spec = SequenceSpec(prompt, 0.8, 0.8, 1.1, seed, args.frames, stop_at_end=False)
        loop.submit(spec, _Sink())
        frames = 0
        while loop.busy:
            frames += sum(h.codes.shape[1] for h in loop.step())
        sync(device)
        t2 = time.perf_counter()
        # The scheduler prefills again: subtract one prefill from the decode wall time.
        return t1 - t0, (t2 - t1) - (t1 - t0), frames

    runs = [engine._worker.call(lambda s=seed: decode_run(s)) for seed in range(args.runs)]
    decode_peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    prefill_s = float(np.median([r[0] for r in runs]))
    decode_s = float(np.median([r[1] for r in runs]))
    frames = runs[0][2]
    fps = frames / decode_s

    # Codec: the same number of frames, streamed in the scheduler's block sizes.
    codes = torch.cat([torch.randint(0, 4096, (1, 1, frames)), torch.randint(0, 1024, (1, 9, frames))], dim=1)
    codec_times = [engine._worker.call(lambda: _time_codec(engine, codes)) for _ in range(3)]
    codec_s = float(np.median(codec_times))

    params = SamplingParams(max_new_tokens=args.request_frames, seed=1)
    reference = ReferenceInput((44100, _reference_signal(10.0)), "A ten second reference clip of someone speaking.")
    latency, ttfa = {}, {}
    for kind, refs in (("short_text", []), ("voice_clone_10s", [reference])):
        totals, ttfa[kind] = [], []
        for i in range(args.requests):
            started = time.perf_counter()
            first = None
            for _ in engine.synthesize_stream(f"{SHORT_TEXT} Request {i}.", references=refs, params=params):
                first = first or time.perf_counter()
            totals.append((time.perf_counter() - started) * 1000)
            ttfa[kind].append((first - started) * 1000)
        latency[kind] = percentiles(totals)
    levels = [c for c in args.concurrency if c <= engine.slots]
    voices = [ReferenceInput((44100, _reference_signal(10.0, seed)), f"Reference voice number {seed}.")
              for seed in (1, 2)]
    for v in voices:  # encoded once before the sweep: a server's voices are warm
        engine.synthesize("Warm up.", references=[v], params=SamplingParams(max_new_tokens=8, seed=0))
    sweep = [concurrency_level(engine, streams, voices, args) for streams in levels]
    stats = engine.stats()
    engine.close()
    return {
        "concurrency": sweep,
        "single_stream": {
            "frames_per_s": fps, "ms_per_frame": 1000 / fps,
            "real_time_factor": FRAMES_PER_AUDIO_SECOND / fps, "x_real_time": fps / FRAMES_PER_AUDIO_SECOND,
            "frames": frames, "prompt_positions": int(prompt.shape[1]),
            "prefill_ms": prefill_s * 1000,
            # Short-text requests; a voice clone's first audio also waits for its longer prompt.
            "ttfa_ms_p50": percentiles(ttfa["short_text"])["p50"], "ttfa_ms_p95": percentiles(ttfa["short_text"])["p95"],
            "ttfa_clone_ms_p50": percentiles(ttfa["voice_clone_10s"])["p50"],
        },
        "codec": {"decode_ms_per_audio_s": codec_s * 1000 / (frames / FRAMES_PER_AUDIO_SECOND),
                  "decode_ms": codec_s * 1000, "frames": frames},
        "latency_ms": latency,
        "memory": {"after_load_gb": after_load, "peak_gb": stats["peak_memory_gb"],
                   "peak_after_warmup_gb": after_warmup, "peak_after_decode_gb": decode_peak},
        "engine": {"compile": stats["compile"], "device": stats["device"], "precision": stats["precision"],
                   "model": stats["model"]},
    }


class _Sink:
    """Owner of a benchmark's bare sequence: never cancelled, failures raised."""

    cancelled = False

    def fail(self, exc):
        raise exc


def measure_configuration(settings: dict, argv: list[str]) -> dict:
    """measure_in_process in a fresh process: after an engine closes, its compiled graphs and their
    memory pools stay in the process (on the H100, a configuration measured after another reported
    0.27 GB more after load than alone)."""
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


def _time_codec(engine, codes) -> float:
    """Streaming decode in the scheduler's block sizes (graphed where the engine graphs them), as a
    request runs it."""
    import torch

    from engine.runtime.scheduler import BLOCK, RAMP

    device = engine.models.placement.device
    runner = engine._core.codec_runner
    codes = codes.to(device)
    sync(device)
    t0 = time.perf_counter()
    runner.decoder.reset([0])
    with torch.inference_mode():
        start = 0
        for size in [*RAMP] + [BLOCK] * (codes.shape[-1] // BLOCK + 1):
            if start < codes.shape[-1]:
                runner._decode(codes[..., start:start + size], [0])
            start += size
    sync(device)
    return time.perf_counter() - t0


def concurrency_level(engine, streams: int, voices, args) -> dict:
    """`streams` clients at once, each sending args.sweep_requests requests back to back; half of
    the requests clone one of `voices`."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.params import SamplingParams

    params = SamplingParams(max_new_tokens=args.request_frames)

    def client(index):
        records = []
        for r in range(args.sweep_requests):
            n = index * args.sweep_requests + r
            refs = [voices[n % 2]] if n % 4 < 2 else []
            started, arrivals = time.perf_counter(), []
            try:
                for chunk in engine.synthesize_stream(f"{SHORT_TEXT} This is stream {n} at level {streams}.",
                                                      references=refs, params=params):
                    arrivals.append((time.perf_counter(), len(chunk) / engine.sample_rate))
            except Exception as exc:  # counted, not fatal: the sweep reports errors per level
                records.append({"error": repr(exc)})
                continue
            records.append(stream_record(started, arrivals))
        return records

    started = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        records = [r for batch in pool.map(client, range(streams)) for r in batch]
    wall = time.perf_counter() - started
    ok = [r for r in records if r.get("audio_s")]
    errors = [r["error"] for r in records if "error" in r]
    if not ok:
        raise RuntimeError(f"no request at {streams} streams produced audio; errors: {errors[:3]}")
    audio = sum(r["audio_s"] for r in ok)
    return {"streams": streams, "requests": len(records), "errors": len(errors),
            "audio_s_per_s": audio / wall, "frames_per_s": audio * FRAMES_PER_AUDIO_SECOND / wall,
            **level_summary(ok), "wall_s": wall, "audio_s": audio, "error_examples": errors[:3]}


def _reference_signal(seconds: float, seed: int = 0):
    import numpy as np

    t = np.arange(int(44100 * seconds)) / 44100
    rng = np.random.default_rng(seed)
    pitch = 120 + 30 * seed
    voiced = 0.3 * np.sin(2 * np.pi * (pitch + 40 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (voiced * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


# ---- report ----------------------------------------------------------------------------------------


def project_commit(root: Path = ROOT) -> str:
    """HEAD's short hash, with "+modified" when tracked files differ from it (a benchmark machine's copy
    of a working tree can come with a stale .git: its HEAD alone would name the wrong code).
    S1_COMMIT, when set, names the commit instead."""
    if os.environ.get("S1_COMMIT"):
        return os.environ["S1_COMMIT"]

    def git(*args: str) -> str | None:
        try:
            run = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:  # no git here
            return None
        return run.stdout.strip() if run.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    changes = git("status", "--porcelain", "--untracked-files=no")
    if changes is None:  # e.g. a broken index: say so rather than call the tree clean
        return head + "+status-unknown"
    return head + ("+modified" if changes else "")


def environment() -> dict:
    import torch

    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "commit": project_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def write_reports(report: dict, json_path: Path | None, html_path: Path | None, write_html) -> None:
    """The report as JSON and, through write_html(path, report), as HTML, where paths are given."""
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
    if html_path:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        write_html(html_path, report)


def print_table(results: list[dict]) -> None:
    rows = [
        ("frames/s (single stream)", lambda r: r["single_stream"]["frames_per_s"], "{:.0f}"),
        ("x real time", lambda r: r["single_stream"]["x_real_time"], "{:.1f}"),
        ("prefill ms", lambda r: r["single_stream"]["prefill_ms"], "{:.1f}"),
        ("TTFA ms p50 (streaming)", lambda r: r["single_stream"]["ttfa_ms_p50"], "{:.0f}"),
        ("TTFA ms p50, 10 s voice clone", lambda r: r["single_stream"]["ttfa_clone_ms_p50"], "{:.0f}"),
        ("codec ms / audio s", lambda r: r["codec"]["decode_ms_per_audio_s"], "{:.1f}"),
        ("cold compile s", lambda r: r.get("startup", {}).get("cold_compile_s"), "{:.1f}"),
        ("warm restart s", lambda r: r.get("startup", {}).get("warm_restart_s"), "{:.1f}"),
        ("memory after load GB", lambda r: r["memory"]["after_load_gb"], "{:.2f}"),
        ("memory peak GB", lambda r: r["memory"]["peak_gb"], "{:.2f}"),
        ("latency p50 ms short", lambda r: r["latency_ms"]["short_text"]["p50"], "{:.0f}"),
        ("latency p99 ms short", lambda r: r["latency_ms"]["short_text"]["p99"], "{:.0f}"),
        ("latency p50 ms clone", lambda r: r["latency_ms"]["voice_clone_10s"]["p50"], "{:.0f}"),
    ]
    names = [r["name"] for r in results]
    print(f"{'':28}" + "".join(f"{n:>22}" for n in names))
    for label, get, fmt in rows:
        cells = []
        for r in results:
            value = get(r)
            cells.append("-" if value is None else fmt.format(value))
        print(f"{label:28}" + "".join(f"{c:>22}" for c in cells))
    for r in results:
        if r.get("concurrency"):
            print(f"\nconcurrency sweep ({r['name']}): streams  audio-s/s  TTFA p50/p95 ms  RTF p50/max  underruns  errors")
            for level in r["concurrency"]:
                print(f"{level['streams']:>38} {level['audio_s_per_s']:>10.1f} {level['ttfa_ms_p50']:>8.0f}/"
                      f"{level['ttfa_ms_p95']:<6.0f} {level['rtf_p50']:>7.3f}/{level['rtf_max']:<6.3f} "
                      f"{level['streams_with_underrun']:>9} {level['errors']:>6}")


def write_html(path: Path, report: dict) -> None:
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configurations"]
    names = [c["name"] for c in configs]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    axes[0].bar(names, [c["single_stream"]["frames_per_s"] for c in configs], color="#4a7")
    axes[0].axhline(212, color="gray", ls="--", label="reference, compiled (212)")
    axes[0].set_title("single-stream frames/s")
    axes[0].legend()
    for c in configs:
        kinds = list(c["latency_ms"])
        axes[1].plot(["p50", "p95", "p99"], [c["latency_ms"][kinds[0]][q] for q in ("p50", "p95", "p99")],
                     marker="o", label=f"{c['name']}: {kinds[0]}")
        axes[1].plot(["p50", "p95", "p99"], [c["latency_ms"][kinds[1]][q] for q in ("p50", "p95", "p99")],
                     marker="s", ls="--", label=f"{c['name']}: {kinds[1]}")
    axes[1].set_title("request latency (ms)")
    axes[1].legend(fontsize=7)
    axes[2].bar(names, [c["memory"]["peak_gb"] or 0 for c in configs], color="#a74")
    axes[2].set_title("peak GPU memory (GB)")
    for c in configs:
        levels = c.get("concurrency") or []
        if levels:
            streams = [lv["streams"] for lv in levels]
            axes[3].plot(streams, [lv["audio_s_per_s"] for lv in levels], marker="o", label=f"{c['name']}: audio-s/s")
            axes[3].plot(streams, [lv["ttfa_ms_p50"] for lv in levels], marker="s", ls="--",
                         label=f"{c['name']}: TTFA p50 ms")
    axes[3].set_xscale("log", base=2)
    axes[3].set_xlabel("concurrent streams")
    axes[3].set_title("continuous batching (codec included)")
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    image = base64.b64encode(buffer.getvalue()).decode()
    env = report["environment"]
    rows = "".join(
        f"<tr><td>{c['name']}</td><td>{c['single_stream']['frames_per_s']:.0f}</td>"
        f"<td>{c['single_stream']['ttfa_ms_p50']:.0f}</td><td>{c['single_stream']['prefill_ms']:.1f}</td>"
        f"<td>{c['codec']['decode_ms_per_audio_s']:.1f}</td>"
        f"<td>{c.get('startup', {}).get('cold_compile_s', float('nan')):.1f}</td>"
        f"<td>{c.get('startup', {}).get('warm_restart_s', float('nan')):.1f}</td>"
        f"<td>{c['memory']['after_load_gb'] or 0:.2f}</td><td>{c['memory']['peak_gb'] or 0:.2f}</td></tr>"
        for c in configs)
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>S1-mini benchmark</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;border-bottom:1px solid #ddd}}</style></head>
<body><h1>S1-mini Studio benchmark</h1>
<p>{env['device']} · torch {env['torch']} · commit {env['commit']} · {env['date']}<br><code>{env['command']}</code></p>
<table><tr><th>config</th><th>frames/s</th><th>TTFA p50 ms</th><th>prefill ms</th><th>codec ms/audio s</th>
<th>cold compile s</th><th>warm restart s</th><th>mem after load GB</th><th>mem peak GB</th></tr>{rows}</table>
<img src="data:image/png;base64,{image}"><pre>{json.dumps(report, indent=2)}</pre></body></html>""")


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
    for spec in args.compare:
        changes = dict(item.split("=", 1) for item in spec.split(","))
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
