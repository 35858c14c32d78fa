#!/usr/bin/env python
"""Where the engine loop's wall time goes under load (host side), at a few concurrency levels.

    python scripts/profile_engine.py --weights random [--levels 1,16,64] [--frames 215] [--json out.json]

Times the GPU worker's parts with scripts/trace_worker.py's spans (request set-up on the worker,
admission and prefill, the decode-step launch, waiting for the frame counts, codec submission,
waiting for finished audio, ...), notes when the first and the last decode step launched, and runs
`--levels` concurrent streams of ~10 s requests through the engine. Per level, `parts_s` sums each
span's time (over all threads: `request_prepare` runs on the callers'); the worker's parts against
the level's wall time show whether the host or the GPU bounds it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from trace_worker import Recorder  # noqa: E402  (this script's folder)
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402


def level_row(spans: list[list], started: float, wall: float) -> dict:
    """parts_s and the decode steps' span for one level, from the spans recorded during it
    (`started`: the level's start on the spans' clock)."""
    parts: dict = defaultdict(float)
    for name, _, begin, end, *_ in spans:
        parts[name] += end - begin
    steps = [span[2] for span in spans if span[0] == "step"]
    return {"wall_s": wall, "parts_s": {name: round(seconds, 4) for name, seconds in sorted(parts.items())},
            # the decode steps' span: from the start to the first launch, and from the last to the end
            "steps": len(steps), "first_step_s": round(steps[0] - started, 4) if steps else None,
            "after_last_step_s": round(wall - (steps[-1] - started), 4) if steps else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
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

    recorder = Recorder()
    recorder.install()  # before the engine exists: its worker keeps bound methods
    engine = TTSEngine.from_config(EngineConfig(**weight_config(args.weights, args.checkpoint),
                                                max_batch_size=max(int(x) for x in args.levels.split(",")),
                                                decode_priority=args.decode_priority == "on"))
    engine.warmup()
    engine.capture_all()
    synth = engine._core
    if args.max_admit:
        synth.scheduler.config = dataclasses.replace(synth.scheduler.config, max_admit_per_step=args.max_admit)
    params = SamplingParams(max_new_tokens=args.frames)
    results = []
    for level in [int(x) for x in args.levels.split(",")]:
        first_span = len(recorder.spans)
        started = time.perf_counter()
        with ThreadPoolExecutor(level) as pool:
            audio = sum(pool.map(lambda i: engine.synthesize(f"Profile request {i}, a sentence or two long.",
                                                             params=params).stats["audio_s"], range(level)))
        wall = time.perf_counter() - started
        row = {"streams": level, "max_admit_per_step": synth.scheduler.config.max_admit_per_step,
               "decode_priority": args.decode_priority == "on", "audio_s_per_s": audio / wall,
               **level_row(recorder.spans[first_span:], started - recorder.origin, wall)}
        results.append(row)
        print(json.dumps(row))
    engine.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
