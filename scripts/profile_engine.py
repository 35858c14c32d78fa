#!/usr/bin/env python
"""Where the engine loop's wall time goes under load (host side), at a few concurrency levels.

    python scripts/profile_engine.py --weights random [--levels 1,16,64] [--frames 215] [--json out.json]

Wraps the parts of one worker iteration with wall-clock accumulators (request set-up on the
worker, admission and prefill, the decode-step launch, waiting for the frame counts, codec
submission, waiting for finished audio), notes when the first and the last decode step launched,
and runs `--levels` concurrent streams of ~10 s requests through the engine. The sum of the parts
against the level's wall time shows whether the host or the GPU bounds it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402  (this script's folder)


def timed_method(obj, name: str, totals: dict, label: str | None = None) -> None:
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label or name] += time.perf_counter() - started

    setattr(obj, name, wrapper)


def record_calls(obj, name: str, times: list) -> None:
    """Append the wall-clock time of every call of obj.name to `times`."""
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        times.append(time.perf_counter())
        return original(*args, **kwargs)

    setattr(obj, name, wrapper)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p)
    p.add_argument("--levels", default="1,16,64")
    p.add_argument("--frames", type=int, default=215)
    p.add_argument("--max-admit", type=int, help="sequences admitted per iteration (Scheduler.max_admit_per_step)")
    p.add_argument("--decode-priority", choices=["on", "off"], default="on",
                   help="the GPU worker on a high-priority stream (EngineConfig.decode_priority)")
    p.add_argument("--json", type=Path)
    args = parse_with_weights(p, argv)

    from engine.config import EngineConfig
    from engine.facade import TTSEngine
    from engine.params import SamplingParams
    from engine.runtime import scheduler as scheduler_module

    engine = TTSEngine.from_config(EngineConfig(**weight_config(args.weights, args.checkpoint),
                                                max_batch_size=max(int(x) for x in args.levels.split(",")),
                                                decode_priority=args.decode_priority == "on"))
    engine.warmup()
    engine.capture_all()
    synth = engine._synthesizer
    if args.max_admit:
        synth.scheduler.max_admit_per_step = args.max_admit
    totals: dict = defaultdict(float)
    # The worker holds bound methods: wrap its own references.
    timed_method(engine._worker, "_iterate", totals, "iterate (all)")
    timed_method(engine._worker, "_run", totals, "request set-up (worker)")
    timed_method(synth.scheduler, "_admit", totals, "admit + prefill")
    timed_method(synth.scheduler, "_step", totals, "step launch + snapshot")
    timed_method(synth.codec_runner, "submit", totals, "codec submit")
    timed_method(synth.codec_runner, "completed", totals, "codec completed (incl. waits)")
    timed_method(scheduler_module._Snapshot, "wait", totals, "frame-count wait")
    timed_method(synth.runner, "prefill_many", totals, "prefill call")
    step_calls: list = []  # when each batched decode step was launched
    record_calls(synth.runner, "step", step_calls)
    params = SamplingParams(max_new_tokens=args.frames)
    results = []
    for level in [int(x) for x in args.levels.split(",")]:
        totals.clear()
        step_calls.clear()
        started = time.perf_counter()
        with ThreadPoolExecutor(level) as pool:
            audio = sum(pool.map(lambda i: engine.synthesize(f"Profile request {i}, a sentence or two long.",
                                                             params=params).stats["audio_s"], range(level)))
        wall = time.perf_counter() - started
        row = {"streams": level, "max_admit_per_step": synth.scheduler.max_admit_per_step,
               "decode_priority": args.decode_priority == "on",
               "wall_s": wall, "audio_s_per_s": audio / wall,
               "parts_s": {k: round(v, 4) for k, v in totals.items()},
               # the decode steps' span: from the start to the first launch, and from the last to the end
               "steps": len(step_calls), "first_step_s": round(step_calls[0] - started, 4) if step_calls else None,
               "after_last_step_s": round(wall - (step_calls[-1] - started), 4) if step_calls else None}
        results.append(row)
        print(json.dumps(row))
    engine.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
