#!/usr/bin/env python
"""Time the decode step's attention kernel (engine/model/decode_attention.py) in its launch settings.

    python scripts/bench_decode_attention.py [--json out.json]

S1-mini's slow-layer shapes (16 query heads over 8 kv heads, head dim 128, q/k norms, bf16, each
layer its own cache), for a few (batch, kv bucket, row lengths) cases: each launch setting (keys
per program, keys per iteration, warps, pipeline stages) is captured 28 times in a CUDA graph, like
the step's 28 layers, and timed per call. The same work compiled by Inductor from the plain ops
(Attention.attend without the kernel: norms, RoPE, the KV write, dual_ar.one_query_attention) is
timed the same way. Prints the fastest settings per case with the bandwidth over the live keys.
Needs CUDA and Triton.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.model import decode_attention as kernel  # noqa: E402
from engine.model import dual_ar  # noqa: E402
from graph_timing import microseconds_per_call  # noqa: E402  (this script's folder)

CASES = [(64, 512, "half"), (64, 512, "random"), (64, 1024, "half"), (64, 1024, "random"), (1, 512, "half"),
         (16, 1024, "random")]
SETTINGS = [s for s in itertools.product((32, 64, 128, 256), (32, 64, 128), (2, 4, 8), (1, 2, 3)) if s[1] <= s[0]]
LAYERS = 28


def make_case(batch: int, kv_len: int, lengths: str):
    """(Attention module, its attend() arguments but the KV view, one KV view per layer). Each layer
    has caches of its own, as in the step: one cache read 28 times would partly stay in the L2 cache
    (50 MB on an H100) and time faster than the step runs."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    attn = dual_ar.Attention(2048, 16, 8, 128, 1e-6, True, False, False).cuda().bfloat16()
    qkv = torch.randn(batch, 1, 4096, device="cuda", generator=gen).bfloat16()
    if lengths == "half":
        positions = torch.full((batch,), kv_len // 2 - 1, device="cuda")
    else:  # random lengths from a quarter of the bucket to all of it
        positions = torch.randint(kv_len // 4, kv_len, (batch,), device="cuda", generator=gen)
    rope = dual_ar.rope_table(kv_len, 128, 1e6).cuda()[positions][:, None]
    key_positions = torch.arange(kv_len, device="cuda")
    mask = key_positions <= positions[:, None, None, None]
    layers = [dual_ar.KVView(*(torch.randn(batch, 8, kv_len, 128, device="cuda", generator=gen).bfloat16()
                               for _ in range(2)), positions[:, None], key_positions, mask) for _ in range(LAYERS)]
    return attn, qkv, rope, layers


def time_case(batch: int, kv_len: int, lengths: str) -> dict:
    """Every launch setting (and the compiled plain ops) on one case; prints the fastest five."""
    attn, qkv, rope, layers = make_case(batch, kv_len, lengths)
    live_bytes = int(layers[0].positions.sum() + batch) * 8 * 128 * 2 * 2  # keys and values, bf16
    ops_attend = torch.compile(attn.attend)  # the plain ops (attn.use_decode_kernel() not called)
    for layer in layers:  # any compiling (a guard per layer's view) before the capture
        ops_attend(qkv, rope, layer)
    ops_us = microseconds_per_call(lambda i: ops_attend(qkv, rope, layers[i]), LAYERS)
    norms, positions = attn.kernel_norms(), layers[0].positions[:, 0]

    op = kernel.decode_attention_one_row if batch == 1 else kernel.decode_attention  # as Attention.attend picks

    def kernel_call(i):
        return op(qkv[:, 0], *norms, rope.reshape(batch, -1), layers[i].k, layers[i].v, positions, kv_len, attn.n_head)

    chosen = (kernel.SPLIT_KEYS, kernel.ONE_ROW_SPLIT_KEYS, kernel.BLOCK_KEYS, kernel.NUM_WARPS, kernel.NUM_STAGES)
    timed = []
    for setting in SETTINGS:
        split, kernel.BLOCK_KEYS, kernel.NUM_WARPS, kernel.NUM_STAGES = setting
        kernel.SPLIT_KEYS = kernel.ONE_ROW_SPLIT_KEYS = split
        timed.append((microseconds_per_call(kernel_call, LAYERS), setting))
    kernel.SPLIT_KEYS, kernel.ONE_ROW_SPLIT_KEYS, kernel.BLOCK_KEYS, kernel.NUM_WARPS, kernel.NUM_STAGES = chosen
    timed.sort()
    print(f"batch {batch}, bucket {kv_len}, {lengths} lengths: live KV {live_bytes / 1e6:.1f} MB; "
          f"plain ops compiled {ops_us:.1f} us/call")
    for us, (split, block, warps, stages) in timed[:5]:
        print(f"  {us:6.1f} us  {live_bytes / us / 1e6:.2f} TB/s  keys/program {split}, keys/iteration {block}, "
              f"warps {warps}, stages {stages}")
    return {"batch": batch, "kv_bucket": kv_len, "lengths": lengths, "live_kv_mb": live_bytes / 1e6,
            "plain_ops_compiled_us": ops_us,
            "settings": [{"us": us, "keys_per_program": s[0], "keys_per_iteration": s[1], "warps": s[2],
                          "stages": s[3]} for us, s in timed]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--cases", help="only these cases, as batch:bucket:lengths,... (default: all of CASES)")
    args = p.parse_args(argv)
    cases = [(int(b), int(k), n) for b, k, n in (c.split(":") for c in args.cases.split(","))] if args.cases else CASES
    report = [time_case(*case) for case in cases]
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "cases": report}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
