"""Probe (prepared, not yet run): would the batched steps' projections run faster if each one's
weights were already in L2 when it starts?

A batch-64 step makes ~270 projections of 64 rows in cuBLAS, ~6 us each, one after the other, and
reads ~1.8 GB of weights: ~0.7-0.8 ms of memory traffic in ~1.7 ms (docs/PERFORMANCE.md, 2026-11-27).
This times, in CUDA graphs on one GPU, chains of distinct-weight projections shaped as a slow layer
(qkv, output, gate/up, down) repeated for 28 layers (0.84 GB of weights), L2 flushed before each replay:

  plain     the chain on one stream (as the step runs it now)
  prefetch  the same, and a second stream reads projection j+1's weights into L2 (a Triton kernel
            that loads them and keeps one float a program) while projection j runs
  prefetch_layer  the same a layer at a time (one fork a layer instead of one a projection)
  hot       every projection right after a read of its own weights on the same stream: the
            projections' time when their weights are in L2 (the reads are timed apart and subtracted)
  reads     the reads alone

If `prefetch` beats `plain` by a good part of the difference between `plain` and `hot`, a step built
that way (or a projection kernel that requests its weights before its PDL wait) is worth writing.
Usage: python docs/benchmarks/session-s35/l2_prefetch_probe.py [--rows 64] [--layers 28] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

# (K, N) of a slow layer's projections, gate/up as one (K, 2N) weight, as the batched step has them.
SLOW_LAYER = [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]
READ_BLOCK = 8192  # weight elements a program of _read_into_l2 loads


@triton.jit
def _read_into_l2(w_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """Load BLOCK elements of w (so that they sit in L2) and keep their sum, so that the loads stay."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(w_ptr + offsets, mask=offsets < numel, other=0.0, eviction_policy="evict_last")
    tl.store(out_ptr + tl.program_id(0), tl.sum(values.to(tl.float32)))


def read_into_l2(weight: torch.Tensor, sink: torch.Tensor) -> None:
    programs = triton.cdiv(weight.numel(), READ_BLOCK)
    _read_into_l2[(programs,)](weight, sink, weight.numel(), BLOCK=READ_BLOCK, num_warps=8)


def capture(body) -> torch.cuda.CUDAGraph:
    body()  # warm-up outside the graph: cuBLAS picks its kernels, Triton compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def timed_ms(graph: torch.cuda.CUDAGraph, flush: torch.Tensor, replays: int) -> float:
    """Median of `replays` timings of one replay, L2 flushed (a 256 MB write) before each."""
    times = []
    for _ in range(replays):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    shapes = SLOW_LAYER * args.layers
    weights = [torch.randn(n, k, device=device, dtype=dtype) / k ** 0.5 for k, n in shapes]
    inputs = {k: torch.randn(args.rows, k, device=device, dtype=dtype) for k, _ in SLOW_LAYER}
    outputs = [torch.empty(args.rows, n, device=device, dtype=dtype) for _, n in shapes]
    sinks = [torch.empty(triton.cdiv(w.numel(), READ_BLOCK), device=device) for w in weights]
    flush = torch.empty(256 * 2**20 // 4, device=device)
    side = torch.cuda.Stream()

    def project(j: int) -> None:
        torch.matmul(inputs[shapes[j][0]], weights[j].t(), out=outputs[j])

    def plain() -> None:
        for j in range(len(shapes)):
            project(j)

    # Each body reads the current stream when it runs: inside torch.cuda.graph that is the capture
    # stream, and a fork from any other stream would leave the side stream's work out of the graph.
    def prefetch() -> None:
        main_stream = torch.cuda.current_stream()
        side.wait_stream(main_stream)
        with torch.cuda.stream(side):
            read_into_l2(weights[0], sinks[0])
        for j in range(len(shapes)):
            main_stream.wait_stream(side)  # projection j's weights are in L2
            if j + 1 < len(shapes):
                side.wait_stream(main_stream)
                with torch.cuda.stream(side):
                    read_into_l2(weights[j + 1], sinks[j + 1])
            project(j)
        main_stream.wait_stream(side)

    def prefetch_layer() -> None:
        """One fork a layer rather than one a projection: layer l+1's four weights (30 MB) read
        while layer l runs (L2 is 50 MB on an H100: they do not all stay)."""
        main_stream = torch.cuda.current_stream()
        per_layer = len(SLOW_LAYER)

        def read_layer(layer: int) -> None:
            side.wait_stream(main_stream)
            with torch.cuda.stream(side):
                for j in range(layer * per_layer, (layer + 1) * per_layer):
                    read_into_l2(weights[j], sinks[j])

        read_layer(0)
        for layer in range(args.layers):
            main_stream.wait_stream(side)
            if layer + 1 < args.layers:
                read_layer(layer + 1)
            for j in range(layer * per_layer, (layer + 1) * per_layer):
                project(j)
        main_stream.wait_stream(side)

    def hot() -> None:
        for j in range(len(shapes)):
            read_into_l2(weights[j], sinks[j])
            project(j)

    def reads() -> None:
        for j in range(len(shapes)):
            read_into_l2(weights[j], sinks[j])

    results = {}
    for name, body in (("plain", plain), ("prefetch", prefetch), ("prefetch_layer", prefetch_layer), ("hot", hot),
                       ("reads", reads)):
        graph = capture(body)
        if name != "plain":  # the graph must hold every read (a read left out of it leaves its sums at zero)
            for sink in sinks:
                sink.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert min(sink.abs().sum().item() for sink in sinks) > 0, f"{name}: reads missing from the graph"
        results[name] = timed_ms(graph, flush, args.replays)
    results["hot_minus_reads"] = results["hot"] - results["reads"]
    gigabytes = sum(w.numel() * w.element_size() for w in weights) / 1e9
    print(f"{torch.cuda.get_device_name()}, {len(shapes)} projections of {args.rows} rows, {gigabytes:.2f} GB of weights")
    for name, ms in results.items():
        print(f"{name:16s} {ms:8.3f} ms  {1000 * ms / len(shapes):6.2f} us a projection")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": args.rows, "projections": len(shapes),
                       "weights_gb": gigabytes, "ms": results}, f, indent=1)


if __name__ == "__main__":
    main()
