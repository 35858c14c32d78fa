#!/usr/bin/env python
"""How the decode step and the streaming codec scale with the batch (full-size weights, GPU).

    python scripts/profile_batch.py --weights random [--batches 1,8,16,32,64] [--kv 1024] [--codec-layout channels-first [--codec-convs cudnn]] [--json out.json]

For each batch size: the graphed decode step's time per step (every row one frame), and the
streaming codec's time per chunk of --chunk frames for that many rows, eager and replayed as a
CUDA graph. Prints frames/s and audio-seconds per second for each, the numbers that bound what
continuous batching can reach.
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

FRAMES_PER_AUDIO_SECOND = 44100 / 2048


def timed(fn, repeats: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def graphed(fn):
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def top_kernels(fn, calls: int = 5, top: int = 15) -> list[tuple[str, float, float]]:
    """(kernel name, launches per call, GPU us per call) of fn's most expensive kernel kinds."""
    import torch
    from profile_step import kernel_kinds
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
    rows = kernel_kinds([e for e in prof.events() if e.device_type.name == "CUDA"], calls)
    for name, n, us in rows[:top]:
        print(f"{us:9.1f} us/chunk {n:6.1f}x  {name[:100]}")
    print(f"codec: {sum(r[2] for r in rows):.0f} us of GPU per chunk in {sum(r[1] for r in rows):.0f} kernels")
    return rows[:top]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p)
    p.add_argument("--compile", default="on", choices=["on", "off"])
    p.add_argument("--batches", default="1,8,16,32,64")
    p.add_argument("--kv", type=int, default=1024, help="kv bucket of the timed steps")
    p.add_argument("--chunk", type=int, default=16, help="codec chunk in frames")
    p.add_argument("--codec-layout", default="channels-last", choices=["channels-last", "channels-first"],
                   help="the codec decoder streamed channels-last by Triton kernels, as the engine runs it with compile "
                        "on, or channels-first with eager pointwise work, as without Triton")
    p.add_argument("--codec-convs", default="tuned", choices=["tuned", "cudnn"],
                   help="channels-first: the decoder's convs timed per shape against a matmul, as the engine runs "
                        "them with CUDA graphs and no Triton, or cuDNN's")
    p.add_argument("--codec-kernels", action="store_true",
                   help="also list the codec's kernels by GPU time per chunk at the largest batch (torch.profiler)")
    p.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its convolution algorithms")
    p.add_argument("--json", type=Path)
    args = parse_with_weights(p, argv)
    batches = [int(b) for b in args.batches.split(",")]

    import torch

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    from engine import compilation
    from engine.config import EngineConfig
    from engine.loader import load_models
    from engine.model.codec_stream import StreamingDecoder
    from engine.model.tuned_conv import tune_convs, tuning
    from engine.runtime.kv_cache import KVCache
    from engine.runtime.step_runner import StepRunner

    models = load_models(EngineConfig(**weight_config(args.weights, args.checkpoint),
                                      device="cuda"))
    model, c = models.model, models.model.config
    slots = max(batches)
    cache = KVCache(c.n_layer, slots, c.n_local_heads, args.kv, c.head_dim, models.placement.dtype, "cuda")
    policy = compilation.decide(args.compile, torch.device("cuda"))
    runner = StepRunner(model, cache, policy)
    if args.codec_layout == "channels-last":
        if not policy.compile:
            p.error("--codec-layout channels-last needs Triton (--compile on)")
        from engine.runtime.codec_runner import set_up_codec

        set_up_codec(models.codec, policy)  # as the engine: the decoder channels-last, the post-transformer compiled
    elif args.codec_convs == "tuned":
        tune_convs(models.codec.decoder)
    runner.kv_buckets = [args.kv]
    runner.prepare(batches)
    for slot in range(slots):
        runner.state.start(slot, torch.zeros(c.num_codebooks + 1, dtype=torch.long, device="cuda"), args.kv // 2,
                           0.8, 0.8, 1.1, slot)

    rows = []
    for batch in batches:
        runner.state.positions.fill_(args.kv // 2)
        step_s = timed(lambda: runner.step(batch, args.kv), 50)
        decoder = StreamingDecoder(models.codec, batch)
        codes = torch.cat([torch.randint(0, 4096, (batch, 1, args.chunk)),
                           torch.randint(0, 1024, (batch, 9, args.chunk))], 1).cuda()
        with torch.inference_mode(), tuning(models.codec.decoder):  # the first call times new shapes
            codec_eager_s = timed(lambda: decoder.decode(codes), 10)
            codec_graph_s = timed(graphed(lambda: decoder.decode(codes)), 20)
        audio_s = batch * args.chunk / FRAMES_PER_AUDIO_SECOND
        rows.append({
            "batch": batch, "step_ms": step_s * 1000, "frames_per_s": batch / step_s,
            "decode_audio_s_per_s": batch / step_s / FRAMES_PER_AUDIO_SECOND,
            "codec_eager_ms": codec_eager_s * 1000, "codec_graph_ms": codec_graph_s * 1000,
            "codec_graph_audio_s_per_s": audio_s / codec_graph_s,
            "codec_eager_audio_s_per_s": audio_s / codec_eager_s,
        })
        print(json.dumps(rows[-1]))
    codec_kernels = top_kernels(lambda: decoder.decode(codes)) if args.codec_kernels else None
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "kv": args.kv,
              "cudnn_benchmark": args.cudnn_benchmark, "codec_layout": args.codec_layout, "codec_convs": args.codec_convs,
              "chunk": args.chunk, "rows": rows, "codec_top_kernels": codec_kernels, "peak_gb": torch.cuda.max_memory_allocated() / 1e9}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
