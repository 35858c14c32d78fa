#!/usr/bin/env python
"""Time the decode step's attention kernel (engine/model/decode_attention.py) in its launch settings.

    python scripts/bench_decode_attention.py [--json out.json]

S1-mini's slow-layer shapes (16 query heads over 8 kv heads, head dim 128, q/k norms, bf16, a
4,096-position cache), for a few (batch, kv bucket, row lengths) cases: each launch setting (keys
per program, keys per iteration, warps, pipeline stages) is captured 28 times in a CUDA graph, like
the step's 28 layers, and timed per call. The same work compiled by Inductor from the plain ops
(Attention.attend without the kernel: norms, RoPE, the KV write, dual_ar.one_query_attention) is
timed the same way. Prints the fastest settings per case with the bandwidth over the live keys.
Needs CUDA and Triton.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.model import decode_attention as kernel  # noqa: E402
from engine.model import dual_ar  # noqa: E402
from graph_timing import microseconds_per_call  # noqa: E402  (this script's folder)

CASES = [(64, 1024, "half"), (64, 1024, "random"), (1, 512, "half"), (16, 1024, "random")]
SETTINGS = [s for s in itertools.product((64, 128, 256), (32, 64, 128), (4, 8), (1, 2, 3)) if s[1] <= s[0]]
LAYERS = 28


def make_case(batch: int, kv_len: int, lengths: str, capacity: int = 4096):
    """(Attention module, its attend() arguments but the KV view, the KV view)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    attn = dual_ar.Attention(2048, 16, 8, 128, 1e-6, True, False, False).cuda().bfloat16()
    qkv = torch.randn(batch, 1, 4096, device="cuda", generator=gen).bfloat16()
    keys, values = (torch.randn(batch, 8, capacity, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
    if lengths == "half":
        positions = torch.full((batch,), kv_len // 2 - 1, device="cuda")
    else:  # random lengths from a quarter of the bucket to all of it
        positions = torch.randint(kv_len // 4, kv_len, (batch,), device="cuda", generator=gen)
    rope = dual_ar.rope_table(capacity, 128, 1e6).cuda()[positions][:, None]
    key_positions = torch.arange(kv_len, device="cuda")
    kv = dual_ar.KVView(keys, values, positions[:, None], key_positions, key_positions <= positions[:, None, None, None])
    return attn, qkv, rope, kv


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    args = p.parse_args(argv)
    chosen = (kernel.SPLIT_KEYS, kernel.ONE_ROW_SPLIT_KEYS, kernel.BLOCK_KEYS, kernel.NUM_WARPS, kernel.NUM_STAGES)
    report = []
    for batch, kv_len, lengths in CASES:
        attn, qkv, rope, kv = make_case(batch, kv_len, lengths)
        live_bytes = int(kv.positions.sum() + batch) * 8 * 128 * 2 * 2  # keys and values, bf16
        ops_attend = torch.compile(attn.attend)  # the plain ops (attn.use_decode_kernel() not called)
        ops_call = functools.partial(ops_attend, qkv, rope, kv)
        ops_us = microseconds_per_call(lambda _, call=ops_call: call(), LAYERS)
        operands = (qkv[:, 0], *attn.kernel_norms(), rope.reshape(batch, -1), kv.k, kv.v, kv.positions[:, 0], kv_len,
                    attn.n_head)
        timed = []
        for setting in SETTINGS:
            split, kernel.BLOCK_KEYS, kernel.NUM_WARPS, kernel.NUM_STAGES = setting
            kernel.SPLIT_KEYS = kernel.ONE_ROW_SPLIT_KEYS = split
            call = functools.partial(kernel.decode_attention, *operands)
            timed.append((microseconds_per_call(lambda _, call=call: call(), LAYERS), setting))
        kernel.SPLIT_KEYS, kernel.ONE_ROW_SPLIT_KEYS, kernel.BLOCK_KEYS, kernel.NUM_WARPS, kernel.NUM_STAGES = chosen
        timed.sort()
        print(f"batch {batch}, bucket {kv_len}, {lengths} lengths: live KV {live_bytes / 1e6:.1f} MB; "
              f"plain ops compiled {ops_us:.1f} us/call")
        for us, (split, block, warps, stages) in timed[:5]:
            print(f"  {us:6.1f} us  {live_bytes / us / 1e6:.2f} TB/s  keys/program {split}, keys/iteration {block}, "
                  f"warps {warps}, stages {stages}")
        report.append({"batch": batch, "kv_bucket": kv_len, "lengths": lengths, "live_kv_mb": live_bytes / 1e6,
                       "plain_ops_compiled_us": ops_us,
                       "settings": [{"us": us, "keys_per_program": s[0], "keys_per_iteration": s[1], "warps": s[2],
                                     "stages": s[3]} for us, s in timed]})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "cases": report}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
