#!/usr/bin/env python
"""Where a decode frame's time goes: kernels per frame and GPU time per kernel kind.

    python tools/profile_step.py --weights random [--compile on|off] [--quantize int8] [--pdl on|off] [--fused-projections on|off]
                                   [--batch 64] [--inductor max_autotune=True ...] [--json out.json]

Times the graphed step (one batch size, default 1, and one kv bucket; "per frame" means per step of
every row, frames/s counts each row's frame), then runs the same step outside CUDA graphs under
torch.profiler so that every kernel is seen, and prints the kernels per frame, the GPU
busy time per frame and the kernels that take the most time; the JSON also lists one frame's
kernels in launch order. Rows start at position kv / 2 (100 for one row) and move one position a
step, so the attention reads more keys than that: the output gives the positions each part covered.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMED_STEPS = 200
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the engine, and the scripts' shared options
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--compile", default="on", choices=["on", "off"])
    p.add_argument("--compile-mode", default="default", choices=["default", "max-autotune"])
    p.add_argument("--quantize", default="none", choices=["none", "int8", "int4", "fp8"])
    p.add_argument("--pdl", default="on", choices=["on", "off"],
                   help="programmatic dependent launch between Triton kernels (the engine's default: on)")
    p.add_argument("--fused-projections", default="on", choices=["on", "off"],
                   help="the projections as fused Triton kernels (engine/model/fused_linear.py; the engine's default: on)")
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--kv", type=int, default=512, help="kv bucket to profile")
    p.add_argument("--batch", type=int, default=1,
                   help="rows stepped together (each starting at position kv / 2 when above 1, 100 for one row)")
    p.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                   help="an Inductor config setting to try, e.g. max_autotune=True (repeatable)")
    p.add_argument("--json", type=Path)
    args = parse_with_weights(p, argv)

    import torch
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: the step is timed as the CUDA graph the engine replays")
    for setting in args.inductor:
        set_inductor_config(setting)
    from torch.profiler import ProfilerActivity, profile

    from engine import compilation
    from engine.config import EngineConfig
    from engine.loader import load_models
    from engine.runtime.kv_cache import KVCache
    from engine.runtime.step_runner import StepRunner

    models = load_models(EngineConfig(**weight_config(args.weights, args.checkpoint),
                                      device="cuda", quantize=args.quantize))
    model = models.model
    c = model.config
    cache = KVCache(c.n_layer, args.batch, c.n_local_heads, 4096, c.head_dim, models.placement.dtype, "cuda")
    policy = dataclasses.replace(compilation.decide(args.compile, torch.device("cuda"), compile_mode=args.compile_mode,
                                                    quantize=args.quantize), pdl=args.pdl == "on",
                                 fused_projections=args.fused_projections == "on")
    runner = StepRunner(model, cache, policy)
    runner.prepare([args.batch])
    start_position = 100 if args.batch == 1 else args.kv // 2
    for slot in range(args.batch):
        runner.state.start(slot, torch.zeros(c.num_codebooks + 1, dtype=torch.long, device="cuda"), start_position,
                           0.8, 0.8, 1.1, slot + 1)

    # Graphed wall time per frame. Every step moves a running row one position on, so the timed and
    # the profiled steps attend over more keys than the start position: both ranges are reported.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(TIMED_STEPS):
        runner.step(args.batch, args.kv)
    torch.cuda.synchronize()
    graphed_ms = (time.perf_counter() - t0) / TIMED_STEPS * 1000
    timed_positions = (start_position, int(runner.state.positions[0]) - 1)  # row 0's

    step_views, key_positions = runner._views[args.batch], runner.key_positions[: args.kv]
    with torch.inference_mode():
        runner._step(step_views, key_positions)  # settle
        torch.cuda.synchronize()
        first_profiled = int(runner.state.positions[0])
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.frames):
                runner._step(step_views, key_positions)
            torch.cuda.synchronize()
        profiled_positions = (first_profiled, int(runner.state.positions[0]) - 1)

    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    per_frame = max(len(kernels) // args.frames, 1)
    total_us = sum(e.device_time for e in kernels)
    result = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "compile": policy.describe(),
        "quantize": args.quantize, "pdl": args.pdl, "fused_projections": args.fused_projections, "inductor": args.inductor,
        "batch": args.batch, "kv_bucket": args.kv, "timed_positions": timed_positions,
        "profiled_positions": profiled_positions, "graphed_ms_per_frame": graphed_ms, "graphed_frames_per_s": args.batch * 1000 / graphed_ms,
        "kernels_per_frame": len(kernels) / args.frames, "gpu_ms_per_frame": total_us / args.frames / 1000,
        "top_kernels": kernel_kinds(kernels, args.frames)[:25],
        # One frame's kernels in launch order (the last frame profiled): where fusion breaks shows here.
        "frame_kernels": [[k.name, round(k.device_time, 2)] for k in kernels[-per_frame:]],
    }
    print(f"graphed: {graphed_ms:.3f} ms/frame ({result['graphed_frames_per_s']:.0f} frames/s); kernels/frame "
          f"{result['kernels_per_frame']:.0f}; GPU busy {result['gpu_ms_per_frame']:.3f} ms/frame")
    print("row 0 at positions {}-{} while timed, {}-{} while profiled".format(*timed_positions, *profiled_positions))
    for name, count, us in result["top_kernels"]:
        print(f"{us:8.1f} us/frame {count:6.1f}x  {name[:110]}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def kernel_kinds(kernels, calls: int) -> list[tuple[str, float, float]]:
    """(kernel name, launches per call, GPU us per call) of profiled CUDA kernels, the costliest first."""
    by_name = defaultdict(lambda: [0, 0.0])
    for kernel in kernels:
        by_name[kernel.name][0] += 1
        by_name[kernel.name][1] += kernel.device_time
    return sorted(((name, n / calls, us / calls) for name, (n, us) in by_name.items()), key=lambda r: -r[2])


def set_inductor_config(setting: str) -> None:
    """'a.b=value' -> torch._inductor.config.a.b = value (value a Python literal)."""
    import ast

    import torch
    import torch._inductor.config as config

    from engine.compilation import apply_settings, has_setting

    key, sep, value = setting.partition("=")
    if not sep:
        raise SystemExit(f"--inductor wants KEY=VALUE, got {setting!r}")
    if not has_setting(config, key):  # asked for by name: an error, not a skip
        raise SystemExit(f"torch {torch.__version__}'s torch._inductor.config has no {key}")
    apply_settings(config, {key: ast.literal_eval(value)})


if __name__ == "__main__":
    sys.exit(main())
