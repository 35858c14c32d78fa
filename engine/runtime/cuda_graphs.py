"""Capturing a CUDA graph the one way every runner here does it."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def capture(fn: Callable[[], T], stream: torch.cuda.Stream, pool=None, warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, T]:
    """Run fn `warmup` times on `stream` (compiles and lazy initialisation, such as cuDNN plans and
    cuBLAS handles and workspaces, happen there rather than inside the capture), then capture one
    more call into a graph on the same stream. Returns the graph and what the captured call
    returned (its output buffers, which each replay refills).

    Every runner captures on a stream of its own: a graph keeps the cuBLAS workspace of the stream
    it was captured on, and graphs captured on torch.cuda.graph's one shared default stream crash
    the process when a decode step and a codec chunk replay at once on their two streams (an illegal
    instruction, or a segfault in replay).

    Python's cyclic garbage collector is off during the capture: a collection there could destroy
    another, unreachable graph, a CUDA call that a capture forbids, and the capture then fails with
    "operation failed due to a previous error during capture" (torch >= 2.9 no longer collects
    before capturing; pytorch/pytorch#161037)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            output = fn()
    finally:
        if collecting:
            gc.enable()
    return graph, output
