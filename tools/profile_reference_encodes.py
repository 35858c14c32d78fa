#!/usr/bin/env python
"""What encoding new reference clips costs on the GPU: the engine's ReferenceEncoder (a CUDA graph
per batch bucket, replayed chunk by chunk on its own stream), its encode path set up as the engine
sets it up (`--compile on`: set_up_codec, as with Triton) or as written (`--compile off`).

    python tools/profile_reference_encodes.py --weights random [--seconds 10] [--batches 1,4,8] \
        [--compile on|off] [--chunk-frames N] [--compare] [--top N] [--json out.json]

For each batch size: the wall time from start() to every clip's codes on the host (what the engine
waits for), a pass and a clip; the kernels of one chunk at batch 1 (torch.profiler, one
eager step); --top N, a chunk's kernel time at the largest batch by kind (matmuls, convolutions,
layout copies, attention, compiled passes) and the N kernels that take the most of it.
--compare also encodes the same clips by the other path and reports the share of equal
codes (with random weights VQ near-ties are many: a share below 1 there is not an error by itself;
the GPU tests check the codes up to near-ties).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the engine, and the scripts' shared options
from profile_step import kernel_kinds  # noqa: E402
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402

REPEATS = 5


def parse_batches(text: str) -> list[int]:
    """"1,4,8" -> [1, 4, 8]: distinct batch sizes of at least 1, in order."""
    try:
        batches = sorted({int(b) for b in text.split(",")})
    except ValueError:
        raise ValueError(f"--batches takes comma-separated whole numbers such as 1,4,8, got {text!r}") from None
    if batches[0] < 1:
        raise ValueError(f"--batches must be at least 1, got {text!r}")
    return batches


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each clip (noise), in seconds")
    p.add_argument("--batches", default="1,4,8", help="batch sizes to time (comma-separated)")
    p.add_argument("--compile", choices=["on", "off"], default="on",
                   help="on: the encode path as the engine sets it up with Triton; off: as written")
    p.add_argument("--chunk-frames", type=int, default=None,
                   help="frames a graph replay encodes (default: the engine's, engine.core.REFERENCE_CHUNK_FRAMES)")
    p.add_argument("--compare", action="store_true", help="also encode by the other path and compare the codes")
    p.add_argument("--top", type=int, default=0, help="list the N costliest kernels of a chunk at the largest batch")
    p.add_argument("--json", type=Path)
    args = parse_with_weights(p, argv)
    try:
        batches = parse_batches(args.batches)
    except ValueError as exc:
        p.error(str(exc))
    if not 0 < args.seconds <= 60:
        p.error(f"--seconds must lie in (0, 60], got {args.seconds}")
    if args.chunk_frames is not None and args.chunk_frames < 1:
        p.error(f"--chunk-frames must be at least 1, got {args.chunk_frames}")

    import numpy as np
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: the encodes are timed as the CUDA graphs the engine replays")
    from engine import compilation
    from engine.config import EngineConfig
    from engine.core import REFERENCE_CHUNK_FRAMES
    from engine.loader import load_models

    chunk_frames = args.chunk_frames or REFERENCE_CHUNK_FRAMES

    policy = compilation.decide("on", torch.device("cuda"))
    if args.compile == "on" and not policy.compile:
        p.error(f"--compile on needs what the engine compiles with: {policy.reason}")
    codec = load_models(EngineConfig(**weight_config(args.weights, args.checkpoint), device="cuda")).codec
    rng = np.random.default_rng(0)
    clips = [(0.2 * rng.standard_normal(int(args.seconds * codec.config.sample_rate))).astype(np.float32) for _ in range(batches[-1])]

    measured = encoder_report(codec, args.compile == "on", policy, clips, batches, chunk_frames, top=args.top)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": args.weights,
              "clip_seconds": args.seconds, "compile": args.compile, "chunk_frames": chunk_frames, **measured}
    for row in report["batches"]:
        print(f"batch {row['batch']}: {row['ms_per_pass']:.1f} ms a pass, {row['ms_per_clip']:.1f} ms a clip")
    print(f"{report['kernels_per_chunk']} kernels a {chunk_frames}-frame chunk; "
          f"graphs compiled and captured in {report['prepare_s']:.1f} s")
    if args.top:
        kernels = report["top_kernels"]
        print(f"kernels of a chunk at batch {batches[-1]}, {report['chunk_kernel_ms']:.2f} ms: "
              + ", ".join(f"{kind} {ms:.2f}" for kind, ms in report["ms_by_kind"].items()))
        print("costliest:")
        for row in kernels:
            print(f"  {row['ms']:7.3f} ms {row['calls']:4d} x  {row['kernel'][:110]}")
    if args.compare:
        other = encoder_report(codec, args.compile != "on", policy, clips, batches, chunk_frames, timed=False)
        report["equal_codes"] = {str(b): float(np.concatenate([(x == y).ravel() for x, y in zip(mine, theirs)]).mean())
                                 for b, mine, theirs in zip(batches, measured["codes"], other["codes"])}
        print("equal codes with the other path: " + ", ".join(f"batch {b} {share:.4f}" for b, share in report["equal_codes"].items()))
    del report["codes"]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def encoder_report(codec, compiled: bool, policy, clips, batches: list[int], chunk_frames: int,
                   timed: bool = True, top: int = 0) -> dict:
    """A ReferenceEncoder of `chunk_frames`-frame chunks on a copy of codec, set up as the engine
    would (compiled or as written): its graphs' set-up time, each batch's timings (when timed) and
    codes, kernels a chunk, and with `top` the costliest kernels of a chunk at the largest batch."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.runtime.codec_runner import set_up_codec
    from engine.runtime.reference_encoder import ReferenceEncoder

    codec = copy.deepcopy(codec)
    if compiled:
        set_up_codec(codec, policy)
    frames = -(-len(clips[0]) // codec.config.frame_length)
    encoder = ReferenceEncoder(codec, chunk_frames, max_frames=frames, max_batch=batches[-1])
    prepare_s = encoder.prepare()
    rows, codes = [], []
    for batch in batches:
        def encode():
            return [handle.result().numpy() for handle in encoder.start(clips[:batch])]  # noqa: B023 (called here)
        codes.append(encode())  # the first pass warms up (and is the one compared)
        if timed:
            started = time.perf_counter()
            for _ in range(REPEATS):
                encode()
            ms = (time.perf_counter() - started) / REPEATS * 1e3
            rows.append({"batch": batch, "ms_per_pass": ms, "ms_per_clip": ms / batch})
    step = encoder._encoders[1]
    chunk = torch.zeros(1, 1, encoder.chunk_samples(1), device="cuda")
    with torch.inference_mode():
        step.reset()
        step.step(chunk)  # compiled code runs once before it is counted
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step.step(chunk)
            torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    report = {"prepare_s": prepare_s, "batches": rows, "kernels_per_chunk": kernels, "codes": codes}
    if top:
        report.update(costliest_kernels(encoder._encoders[batches[-1]], encoder.chunk_samples(batches[-1]),
                                        batches[-1], top))
    return report


# (kind, substrings of a kernel's name, any of which puts it there), in order: the first match counts.
KERNEL_KINDS = [
    ("fp32 matmul on CUDA cores", ("ffma", "simt_sgemm")),
    ("convolution", ("fprop", "convolve", "dgrad")),
    ("cuDNN layout copy", ("nchwToNhwc", "nhwcToNchw")),
    ("TF32 matmul", ("tf32",)),
    ("compiled (Inductor)", ("triton_",)),  # before attention: Inductor names its mask passes after it
    ("attention", ("fmha", "attention")),
]


def kernel_kind(name: str) -> str:
    """What a kernel does, from its name (KERNEL_KINDS), "other" if none says."""
    return next((kind for kind, marks in KERNEL_KINDS if any(mark in name for mark in marks)), "other")


def costliest_kernels(step, chunk_samples: int, batch: int, top: int) -> dict:
    """The kernels of one eager chunk at `batch` by their summed GPU time: the `top` costliest."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    chunk = 0.2 * torch.randn(batch, 1, chunk_samples, device="cuda")
    with torch.inference_mode():
        step.reset()
        step.step(chunk)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step.step(chunk)
            torch.cuda.synchronize()
    ranked = kernel_kinds([e for e in prof.events() if e.device_type.name == "CUDA"], calls=1)
    kinds: dict[str, float] = {}
    for name, _, us in ranked:
        kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + us / 1e3
    return {"chunk_kernel_ms": sum(us for _, _, us in ranked) / 1e3,
            "ms_by_kind": dict(sorted(kinds.items(), key=lambda item: -item[1])),
            "top_kernels": [{"kernel": name, "ms": us / 1e3, "calls": int(calls)} for name, calls, us in ranked[:top]]}


if __name__ == "__main__":
    sys.exit(main())
