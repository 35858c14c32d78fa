#!/usr/bin/env python
"""What one codec call costs on the GPU, per row bucket and chunk length: the engine's own codec
graphs (CodecRunner, its kernels and tuned convolutions), each replayed alone.

    python tools/profile_codec_calls.py --weights random [--rows 64] [--row-buckets 1,2,3,4,6,8,...] \
        [--cache-dir DIR] [--json out.json]

For each chunk length the script fits ms = fixed + per_row * bucket over the buckets: `fixed` is
what every call costs whatever its rows (the decoder's ~1,500 kernels launched one after another),
`per_row` what each row adds, padding rows included. Those two numbers say when fewer, fuller calls
or finer buckets pay. First it prepares the graphs as the engine does (rows 1 and 2, then each larger
bucket) and prints how long each step took: with `--cache-dir` an empty dir, what a first start pays.

--parts 1x4,8x32 also times a call's four parts for those rows x frames, each in a CUDA graph of
its own: the codebooks' sum (VQ decode), the quantizer's post-transformer, its upsampler, the
decoder; with each part's kernel count (torch.profiler, one eager call).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the engine, and the scripts' shared options
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402

REPLAYS = 20
MAX_FRAMES = 1024  # the runner's streams: its RoPE tables are reserved for this many frames
# A part is decoded REPLAYS + 4 times between resets (warm-ups, capture, replays): within the tables.
MAX_PART_FRAMES = MAX_FRAMES // (REPLAYS + 4)


def fit_fixed_and_per_row(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ms = fixed + per_row * rows over (rows, ms) points; (ms, 0) for one bucket."""
    if len({rows for rows, _ in points}) < 2:
        return sum(ms for _, ms in points) / len(points), 0.0
    n = len(points)
    mean_r = sum(r for r, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    per_row = sum((r - mean_r) * (t - mean_t) for r, t in points) / sum((r - mean_r) ** 2 for r, _ in points)
    return mean_t - per_row * mean_r, per_row


def prepare_like_the_engine(runner) -> dict[int, float]:
    """Capture the runner's graphs in steps, as the engine does (graph_capture): those of one and two
    rows, as before the first request, then each larger row bucket on its own (the engine's later
    steps take a decode batch bucket's, one or two row buckets); {rows: seconds} per step, compiling
    and capturing included."""
    first = min(2, runner.row_buckets[-1])
    steps = [first] + [rows for rows in runner.row_buckets if rows > first]
    return {rows: runner.prepare(rows) for rows in steps}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--rows", type=int, default=64, help="streams the runner holds (the engine's slots)")
    p.add_argument("--row-buckets", help="comma-separated row buckets to capture instead of the runner's own")
    p.add_argument("--parts", help="comma-separated ROWSxFRAMES calls whose parts to time (e.g. 1x4,8x32)")
    p.add_argument("--cache-dir", type=Path,
                   help="compile caches here, as the engine keeps them (an empty dir: what a first start pays)")
    p.add_argument("--json", type=Path)
    args = parse_with_weights(p, argv)
    parts = []
    for shape in (args.parts or "").split(","):
        try:
            rows, frames = (int(v) for v in shape.split("x")) if shape else (0, 0)
        except ValueError:
            p.error(f"--parts takes ROWSxFRAMES items such as 8x32, got {shape!r}")
        if shape and not (1 <= rows <= args.rows and 1 <= frames <= MAX_PART_FRAMES):
            p.error(f"--parts: rows must lie in 1..{args.rows} (--rows) and frames in 1..{MAX_PART_FRAMES}, got {shape}")
        if shape:
            parts.append((rows, frames))

    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: the codec's calls are timed as the CUDA graphs the engine replays")
    from engine import compilation
    from engine.config import EngineConfig
    from engine.loader import load_models
    from engine.runtime.codec_runner import CodecRunner, set_up_codec
    from engine.runtime.scheduler import BLOCK_SIZES

    if args.cache_dir:
        compilation.configure_caches(args.cache_dir)
    models = load_models(EngineConfig(**weight_config(args.weights, args.checkpoint), device="cuda"))
    set_up_codec(models.codec, compilation.decide("on", torch.device("cuda")))  # as the Synthesizer
    runner = CodecRunner(models.codec, args.rows, max_frames=MAX_FRAMES)
    if args.row_buckets:
        runner.row_buckets = sorted({int(b) for b in args.row_buckets.split(",")})
        if runner.row_buckets[-1] > args.rows or runner.row_buckets[0] < 1:
            p.error(f"--row-buckets must lie in 1..{args.rows}")
    prepare_s = prepare_like_the_engine(runner)
    print(f"graphs prepared in {sum(prepare_s.values()):.1f} s: "
          + ", ".join(f"up to {rows} rows {s:.2f} s" for rows, s in prepare_s.items()))

    calls = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # Inference mode as the engine's own calls: the graphs' inputs are inference tensors.
    with torch.inference_mode(), torch.cuda.stream(runner.stream):
        for (bucket, frames), entry in sorted(runner._graphs.items()):
            # Distinct streams, as a real call's, each from its start: 21 replays stay within the
            # RoPE table the runner reserved.
            runner.decoder.reset()
            entry.index.copy_(torch.arange(bucket, device=entry.index.device))
            entry.graph.replay()  # warm
            start.record()
            for _ in range(REPLAYS):
                entry.graph.replay()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end) / REPLAYS
            calls.append({"rows": bucket, "frames": frames, "ms": ms, "us_per_row_frame": 1000 * ms / (bucket * frames)})
            print(f"{bucket:3d} rows x {frames:2d} frames: {ms:7.2f} ms ({calls[-1]['us_per_row_frame']:.1f} us a row-frame)")
    fits = {}
    for frames in BLOCK_SIZES:
        fixed, per_row = fit_fixed_and_per_row([(c["rows"], c["ms"]) for c in calls if c["frames"] == frames])
        fits[frames] = {"fixed_ms": fixed, "per_row_ms": per_row}
        print(f"{frames:2d} frames: {fixed:.2f} ms a call + {per_row:.3f} ms a row")
    parts = [time_parts(runner, rows, frames) for rows, frames in parts]
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": args.rows, "prepare_s": prepare_s, "calls": calls, "fits": fits,
                                         "parts": parts}, indent=1))
    return 0


def time_parts(runner, rows: int, frames: int) -> dict:
    """GPU ms and kernels of each part of a call of `rows` x `frames` (distinct streams from their start)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.model.stream_state import Rows
    from engine.runtime.cuda_graphs import capture

    decoder, q = runner.decoder, runner.decoder.codec.quantizer
    selected = Rows.of(list(range(rows)), runner.device)
    codes = torch.randint(0, q.residual_codebook_size, (rows, runner.num_codebooks, frames), device=runner.device)
    with torch.inference_mode():
        z = q.codebook_sum(codes)
        post = decoder._post.step(z, selected)
        up = decoder._up.step(post, selected)
    steps = {"vq": lambda: q.codebook_sum(codes),
             "post_transformer": lambda: decoder._post.step(z, selected),
             "upsample": lambda: decoder._up.step(post, selected),
             "decoder": lambda: decoder._dec.step(up, selected)}
    result = {"rows": rows, "frames": frames}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.inference_mode():
        for name, step in steps.items():
            decoder.reset()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
            graph, _ = capture(step, runner.stream)
            decoder.reset()
            with torch.cuda.stream(runner.stream):
                graph.replay()
                start.record()
                for _ in range(REPLAYS):
                    graph.replay()
                end.record()
            end.synchronize()
            result[name] = {"ms": start.elapsed_time(end) / REPLAYS, "kernels": kernels}
    print(f"{rows} rows x {frames} frames, by part: " + ", ".join(
        f"{name} {v['ms']:.3f} ms ({v['kernels']} kernels)" for name, v in result.items() if isinstance(v, dict)))
    return result


if __name__ == "__main__":
    sys.exit(main())
