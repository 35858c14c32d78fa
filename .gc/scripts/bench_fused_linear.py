#!/usr/bin/env python
"""Time the decode step's fused projections (engine/model/fused_linear.py) against Inductor's.

    python scripts/bench_fused_linear.py [--weights bf16|int8] [--quick] [--json out.json]

For each projection of an S1-mini block (full-size shapes, bf16, random values, one row as in the
batch-1 decode step): the same work compiled by Inductor from the plain ops (RMSNorm, F.linear, SiLU
gate, residual add, as the compiled step had them) and the fused Triton kernel in a sweep of launch
settings. Each is captured 28 times in a CUDA graph, like a step's layers, each call with its own
weights (read from memory, not L2), and timed per call. Prints the plain time, the kernel's time in
the engine's setting for that shape (fused_linear.settings_for) and the fastest settings, with the
largest difference from the eager ops.
With --weights int8 the weights are int8 with one scale per row (as --quantize int8 makes them):
the kernel reads them with their scales, and the plain ops dequantize them inside the matmul (which
Inductor fuses, as it did torchao's int8 weights in the compiled step). Needs CUDA and Triton.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.model import fused_linear as kernel  # noqa: E402
from engine.quantization import int8_rows  # noqa: E402
from graph_timing import microseconds_per_call  # noqa: E402  (this script's folder)

# name: (K, N, RMSNorm before, gated, residual after)
SHAPES = {
    "slow_qkv": (1024, 4096, True, False, False),
    "slow_wo": (2048, 1024, False, False, True),
    "fast_qkv": (1024, 2048, True, False, False),
    "fast_wo": (1024, 1024, False, False, True),
    "w13_gated": (1024, 3072, True, True, False),
    "w2": (3072, 1024, False, False, True),
}
# block_k up to the whole of K (3072 as 4096 masked): one block is all of a program's weights requested
# before its PDL wait. Each shape times the settings whose block_k fits its K (a larger one is cut to it).
SETTINGS = [kernel.Launch(block_n=n, block_k=k, num_warps=w)
            for n, k, w in itertools.product((2, 4, 8, 16), (256, 512, 1024, 2048, 4096), (2, 4, 8))]
CALLS, REPLAYS = 28, 50


def plain(x, weight, norm_weight, residual, eps, gated, weight_scale=None):
    if weight_scale is not None:  # int8 rows
        weight = weight.to(x.dtype) * weight_scale[:, None].to(x.dtype)
    if norm_weight is not None:
        xf = x.float()
        x = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * norm_weight
    y = F.linear(x, weight)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if residual is None else residual + y


def operands(rows: int, depth: int, columns: int, norm: bool, gated: bool, residual: bool):
    """Inputs, a weight matrix per layer (CALLS of them: together larger than the L2 cache, so each
    call reads its weights from memory, as a step does), norm weights, residual, eps, gated."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).bfloat16()

    weights = [randn((2 if gated else 1) * columns, depth, scale=depth ** -0.5) for _ in range(CALLS)]
    return (randn(rows, depth), weights, (1 + randn(depth, scale=0.1)) if norm else None,
            randn(rows, columns) if residual else None, 1e-6, gated)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", choices=["bf16", "int8"], default="bf16")
    p.add_argument("--quick", action="store_true", help="time the engine's launch setting only (no sweep)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    compiled_plain = torch.compile(plain)
    report = []
    for name, (depth, columns, norm, gated, residual) in SHAPES.items():
        x, weights, *rest = operands(1, depth, columns, norm, gated, residual)
        scales = [None] * CALLS
        if args.weights == "int8":
            weights, scales = zip(*[int8_rows(w) for w in weights], strict=True)
            scales = [s.view(-1) for s in scales]

        def layer(i, x=x, weights=weights, scales=scales, rest=rest):  # operands of layer i's projection
            return (x, weights[i], *rest, scales[i])

        engine_launch = kernel.settings_for(depth, columns, gated)

        def fused(i, settings=engine_launch):  # the kernel on them
            x, weight, *rest, scale = layer(i)
            return kernel.launch(kernel._fused_linear, x, weight, scale, *rest, settings=settings)

        torch._dynamo.reset()  # each shape its own specialised graph, as in the step
        plain_us = microseconds_per_call(lambda i: compiled_plain(*layer(i)), CALLS, REPLAYS)
        expected = plain(*layer(0)).float()
        timed = []
        fitting = [s for s in SETTINGS if s.block_k <= triton.next_power_of_2(depth)]
        for setting in [engine_launch] if args.quick else fitting:
            try:
                diff = (fused(0, setting).float() - expected).abs().max()
            except triton.runtime.errors.OutOfResources:  # too much shared memory for this setting
                continue
            us = microseconds_per_call(lambda i, setting=setting: fused(i, setting), CALLS, REPLAYS)
            timed.append((us, setting, float(diff)))
        engine_us = microseconds_per_call(fused, CALLS, REPLAYS)
        # Programmatic dependent launch off: each call's weights then stream in only after the call before ends.
        no_pdl = dataclasses.replace(engine_launch, pdl=False)
        no_pdl_us = microseconds_per_call(lambda i, no_pdl=no_pdl: fused(i, no_pdl), CALLS, REPLAYS)
        best_us, best, diff = min(timed, key=lambda t: t[0])
        weight_bytes = weights[0].numel() * weights[0].element_size()
        entry = {"shape": name, "plain_us": round(plain_us, 2), "engine_us": round(engine_us, 2),
                 "engine": engine_launch.__dict__,
                 "engine_without_pdl_us": round(no_pdl_us, 2),
                 "best_us": round(best_us, 2), "best": best.__dict__, "max_abs_diff": diff,
                 "best_weight_tb_s": round(weight_bytes / best_us / 1e6, 2),
                 "settings": [[round(us, 2), s.__dict__] for us, s, _ in sorted(timed, key=lambda t: t[0])]}
        report.append(entry)
        print(f"{name:10s} plain {plain_us:6.2f} us  fused engine {engine_us:6.2f} (without PDL {no_pdl_us:6.2f})  "
              f"best {best_us:6.2f} ({best.block_n}x{best.block_k} w{best.num_warps} s{best.num_stages}, "
              f"{entry['best_weight_tb_s']} TB/s)  max diff {diff:.2e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "weights": args.weights, "cases": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
