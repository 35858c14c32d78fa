#!/usr/bin/env python
"""The first requests after start-up, phase by phase: where does a new server's first audio go?

    python scripts/profile_first_requests.py --weights random [--quantize int8] [--requests 12] [--json out.json]

Starts an engine (compile and warm-up included), then sends requests one at a time in the order
scripts/load_test.py uses (a voice shared by every third request, as a saved voice is: here a clip
sent again, so its codes and prefix are cached after first use; a clip of its own; no voice; ...;
the load test's own 10 s clips) and prints each one's time to first audio and the time of each
phase it went through: reference encoding, prefill (prefix and text apart), prefix-cache copies.
Each phase is timed to the end of its GPU work (a device sync after it), so the numbers add up to
where the time went.
--profile-text-prefill prints the host-side operators of the first prefill after a voice prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402  (this script's folder)

from load_test import (  # noqa: E402  (the same requests as the load test)
    INLINE_TRANSCRIPT,
    SHARED_TRANSCRIPT,
    TEXT,
    inline_clip,
    shared_voice_clip,
    voice_kind,
)

CLIP_SECONDS = 10.0  # load_test's default --reference-seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--quantize", default="none", choices=["none", "int8", "int4", "fp8"])
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=215)
    p.add_argument("--cache-dir", help="the engine's cache dir (compiled kernels, encoded clips); default: the "
                                       "engine's. Clips encoded by an earlier run there are not encoded again")
    p.add_argument("--profile-text-prefill", action="store_true",
                   help="also run the first prefill after a voice prefix under torch.profiler and print its top "
                        "operators by host time")
    p.add_argument("--json", type=Path)
    args = parse_with_weights(p, argv)

    import torch

    from engine.config import EngineConfig
    from engine.facade import ReferenceInput, TTSEngine
    from engine.params import SamplingParams

    started = time.perf_counter()
    engine = TTSEngine.from_config(EngineConfig(**weight_config(args.weights, args.checkpoint), device=args.device,
                                                quantize=args.quantize, cache_dir=args.cache_dir))
    engine.warmup()
    startup_s = time.perf_counter() - started
    synth = engine._core
    cuda = engine.models.placement.device.type == "cuda"
    phases: list[tuple[str, float]] = []

    def timed(owner, name, label=None):
        original = getattr(owner, name)

        def run(*a, **k):
            t0 = time.perf_counter()
            result = original(*a, **k)
            if cuda:
                torch.cuda.synchronize()
            phases.append((label or name, (time.perf_counter() - t0) * 1000))
            return result

        setattr(owner, name, run)

    # The encode runs on a stream of its own; the device-wide synchronize times all of it.
    timed(synth.clip_encodes.encoder, "start", "encode_reference")
    for owner, name in ((synth.runner, "prefill"), (synth.prefix_cache, "get"), (synth.prefix_cache, "place"),
                        (synth.prefix_cache, "store")):
        timed(owner, name)
    if args.profile_text_prefill:
        profile_first_text_prefill(synth.runner)

    saved = [shared_voice_clip(i, CLIP_SECONDS) for i in range(2)]
    records = []
    for n in range(args.requests):
        kind = voice_kind(n)
        references = {"saved_voice": [ReferenceInput(saved[n % 2], SHARED_TRANSCRIPT)],
                      "inline_clip": [ReferenceInput(inline_clip(n, CLIP_SECONDS), INLINE_TRANSCRIPT)],
                      "no_voice": []}[kind]
        phases.clear()
        t0, first = time.perf_counter(), None
        for piece in engine.synthesize_stream(f"{TEXT} This is request number {n}.", references=references,
                                              params=SamplingParams(max_new_tokens=args.max_new_tokens, seed=n)):
            if first is None and len(piece):
                first = (time.perf_counter() - t0) * 1000
        records.append({"n": n, "kind": kind, "ttfa_ms": first, "phases_ms": list(phases)})
        print(f"request {n:3d} {kind:12s} TTFA {first or float('nan'):7.1f} ms   "
              + "  ".join(f"{name} {ms:.1f}" for name, ms in phases))
    engine.close()
    if args.json:
        args.json.write_text(json.dumps({"device": str(engine.models.placement.device), "torch": torch.__version__,
                                         "startup_s": startup_s, "requests": records}, indent=2))
    return 0


def profile_first_text_prefill(runner) -> None:
    """Wrap runner.prefill so that its first call after a prefix (start > 0) runs under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    timed_prefill, done = runner.prefill, []

    def prefill(slot, prompt, start=0, end=None):
        if start == 0 or done:
            return timed_prefill(slot, prompt, start, end)
        done.append(True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            result = timed_prefill(slot, prompt, start, end)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return result

    runner.prefill = prefill


if __name__ == "__main__":
    sys.exit(main())
