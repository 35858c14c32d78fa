"""Time a kernel the way a decode step runs it: captured many times in one CUDA graph, as a step
captures its layers, and replayed (for the kernel benchmarks of this folder)."""

from __future__ import annotations

import torch


def microseconds_per_call(call, calls: int = 28, replays: int = 20) -> float:
    """call(i) runs layer i's work; returns the mean time of one call over graph replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, allocates) outside the capture
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / replays / calls
