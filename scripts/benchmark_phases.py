"""The benchmark's measurements, each run in a fresh process by scripts/benchmark.py (`--phase`):
start-up (process start to first streamed audio, then every batch's graphs) and the in-process
measurements (single stream, codec, latency, the concurrency sweep)."""

from __future__ import annotations

import tempfile
import time

from reports import level_summary, percentiles, stream_record
from weight_options import weight_config

FRAMES_PER_AUDIO_SECOND = 44100 / 2048
SHORT_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."


def engine_config(settings: dict, cache_dir: str | None = None):
    from engine.config import EngineConfig

    return EngineConfig(
        **weight_config(settings["weights"], settings.get("checkpoint")),
        device=settings["device"], precision=settings["precision"], compile=settings["compile"],
        quantize=settings["quantize"], cache_dir=cache_dir, max_batch_size=int(settings.get("max_batch_size", 1)),
        compile_mode=settings.get("compile_mode", "default"),
        compile_helpers=settings.get("compile_helpers", "on") == "on",
        voices_dir=tempfile.mkdtemp(prefix="bench-voices-"), max_text_length=0,
    )


def startup_phase(settings: dict, cache_dir: str) -> dict:
    """Process start -> engine loaded -> one request's graphs compiled and captured -> first streamed
    audio; then the larger batches' graphs (which a server captures after it is ready)."""
    started = time.perf_counter()
    import torch

    from engine.facade import TTSEngine
    from engine.params import SamplingParams

    keep_every_compile_record()
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
            "to_all_graphs_s": all_graphs - started, "torch_compile_s": torch_compile_stages(),
            "compiled_functions": compiled_functions()}


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


def keep_every_compile_record() -> None:
    """Dynamo keeps the records compiled_functions reads for its last 64 compiles only, fewer than a
    start-up makes with every larger batch (a private API: nothing where it is missing)."""
    try:
        from torch._dynamo.utils import set_compilation_metrics_limit

        set_compilation_metrics_limit(4096)
    except Exception:  # compiled_functions then reports what Dynamo kept
        pass


def compiled_functions() -> dict:
    """Per compiled function of this process, costliest first: its graphs (a compile each: every
    specialisation and recompile) and the seconds they took, tracing and compiling or loading from
    the caches, from Dynamo's records of each compile (a private API: {} where it is missing or has
    changed)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics

        functions: dict[str, dict] = {}
        for record in get_compilation_metrics():
            if record.co_name is None or record.entire_frame_compile_time_s is None:
                continue  # not a compile of a function (Dynamo also records other events)
            entry = functions.setdefault(record.co_name, {"graphs": 0, "seconds": 0.0})
            entry["graphs"] += 1
            entry["seconds"] += record.entire_frame_compile_time_s
        return {name: {"graphs": e["graphs"], "seconds": round(e["seconds"], 2)}
                for name, e in sorted(functions.items(), key=lambda item: -item[1]["seconds"])}
    except Exception as exc:  # a benchmark's side detail: reported, never worth failing the run
        return {"unavailable": f"{type(exc).__name__}: {exc}"}


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
