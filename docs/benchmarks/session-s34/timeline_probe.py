"""Where a batch-1 frame's time goes on its critical path: every program of every projection, attention and merge
kernel records, with the GPU's global nanosecond timer, when it started, when its PDL wait let it go, and when it
finished; the batch-1 graph is recaptured with those kernels and replayed.

    python docs/benchmarks/session-s34/timeline_probe.py [--frames 100] [--kv 512] [--json timeline.json]

Per kernel (in launch order within the frame): launched = first program's start, released = first program past its
wait (~ the kernel before it ended), last_released = last program past its wait (programs not resident early start
late), ended = last program's end. Printed per kind of kernel: how early it launched (released - launched), its
exposed time (ended - released: what it adds to the critical path), its late programs (last_released - released),
and the gap from the previous instrumented kernel's end to this one's release (uninstrumented Inductor kernels:
sampling, embeddings, bookkeeping). The kernels are instrumented by rewriting their source at import (the engine's
files are not changed); their results are unchanged. Needs CUDA (Hopper, PDL on), Triton, the engine's packages.
%globaltimer may tick coarsely (the smallest step seen is printed); means over many frames are still informative.
Each end stamp waits for a reduction of the program's output (so that it follows the work it times): a few hundred
ns more "exposed" per kernel than uninstrumented; the attention's end stamp precedes its output stores.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

from engine.model import decode_attention, fused_linear  # noqa: E402


# Triton compiles a kernel from its source file, so the instrumented kernels are written to a module of their own.
HEADER = """import triton
import triton.language as tl
from engine.model.decode_attention import _load_old_keys, _norm_and_rotate
from engine.model.launch_control import let_dependents_launch, wait_for_inputs


@triton.jit
def _clock(after):
    \"\"\"The global timer, read once `after` (an int32 scalar) is known.\"\"\"
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _record(times_ptr, program, t_start, t_wait, t_end):
    i = tl.arange(0, 4)
    tl.store(times_ptr + program * 4 + i, tl.where(i == 0, t_start, tl.where(i == 1, t_wait, t_end)), mask=i < 3)
"""


def instrumented_source(kernel, edits: list[tuple[str, str]]) -> str:
    """The Triton kernel's source with each (anchor, replacement) applied once (times_ptr added by one of them)."""
    source = inspect.getsource(kernel.fn)
    for anchor, replacement in edits:
        assert source.count(anchor) == 1, f"{kernel.fn.__name__}: anchor not found once: {anchor!r}"
        source = source.replace(anchor, replacement)
    return source


ZERO = "tl.full([], 0, tl.int32)"
EDITS = {
    fused_linear._fused_linear: [
        ("weight_eviction: tl.constexpr):", "weight_eviction: tl.constexpr, times_ptr):"),
        ("    n = tl.program_id(0) * block_n + tl.arange(0, block_n)\n",
         f"    n = tl.program_id(0) * block_n + tl.arange(0, block_n)\n    t_start = _clock({ZERO})\n    t_wait = t_start\n"),
        ("        after = wait_for_inputs()\n", "        after = wait_for_inputs()\n        t_wait = _clock(after)\n"),
        ("    tl.store(out_ptr + n, out, mask=live_n)\n",
         "    tl.store(out_ptr + n, out, mask=live_n)\n"
         "    _record(times_ptr, tl.program_id(0), t_start, t_wait, _clock(tl.sum(out.to(tl.float32), 0).to(tl.int32)))\n"),
    ],
    decode_attention._attend_split: [
        ("early_keys: tl.constexpr, pdl: tl.constexpr, launched_pdl: tl.constexpr):",
         "early_keys: tl.constexpr, pdl: tl.constexpr, launched_pdl: tl.constexpr, times_ptr):"),
        ("    dtype = qkv_ptr.dtype.element_ty\n",
         f"    dtype = qkv_ptr.dtype.element_ty\n    t_start = _clock({ZERO})\n    t_wait = t_start\n"),
        ("        qkv_ptr += wait_for_inputs()\n",
         "        after = wait_for_inputs()\n        qkv_ptr += after\n        t_wait = _clock(after)\n"),
        ("    if direct:  # one split: the output itself",
         "    program = (b * tl.num_programs(1) + h) * tl.num_programs(2) + split\n"
         "    _record(times_ptr, program, t_start, t_wait, _clock(tl.sum(tl.sum(acc, 1), 0).to(tl.int32)))\n"
         "    if direct:  # one split: the output itself"),
    ],
    decode_attention._merge_splits: [
        ("split_block: tl.constexpr, pdl: tl.constexpr, launched_pdl: tl.constexpr):",
         "split_block: tl.constexpr, pdl: tl.constexpr, launched_pdl: tl.constexpr, times_ptr):"),
        ("  # row: (batch row, kv head) flattened\n",
         f"  # row: (batch row, kv head) flattened\n    t_start = _clock({ZERO})\n    t_wait = t_start\n"),
        ("        after = wait_for_inputs()\n", "        after = wait_for_inputs()\n        t_wait = _clock(after)\n"),
        ("    tl.store(out_ptr + (row * group + g) * head_dim + d, merged.to(out_ptr.dtype.element_ty))\n",
         "    tl.store(out_ptr + (row * group + g) * head_dim + d, merged.to(out_ptr.dtype.element_ty))\n"
         "    _record(times_ptr, tl.program_id(0) * tl.num_programs(1) + g, t_start, t_wait,"
         " _clock(tl.sum(merged, 0).to(tl.int32)))\n"),
    ],
}


def load_instrumented():
    path = Path(tempfile.mkdtemp()) / "s1_timeline_kernels.py"
    path.write_text(HEADER + "".join("\n\n" + instrumented_source(k, e) for k, e in EDITS.items()))
    spec = importlib.util.spec_from_file_location("s1_timeline_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KERNELS = load_instrumented()
LINEAR, ATTEND, MERGE = KERNELS._fused_linear, KERNELS._attend_split, KERNELS._merge_splits


class Recorder:
    """Hands each launch made inside a CUDA graph capture its own slice of one timing buffer: 4 int64 a
    program (3 used), so that every slice is 16-byte aligned, as Triton specialises its kernels on
    the alignment of pointers and must not compile a new variant inside a capture."""

    def __init__(self, capacity: int = 1 << 20):
        self.capacity = capacity
        self.buffer = torch.zeros(capacity * 4, dtype=torch.int64, device="cuda")
        self.used, self.calls = 0, []  # calls: (kind, offset, programs) in launch order

    def slice(self, kind: str, programs: int) -> torch.Tensor:
        capturing = torch.cuda.is_current_stream_capturing()
        offset = self.used if capturing else 0  # launches outside a capture all share slot 0 (not read)
        assert offset + programs <= self.capacity, "the timing buffer is full"
        if capturing:
            self.used += programs
            self.calls.append((kind, offset, programs))
        return self.buffer[offset * 4:(offset + programs) * 4]


RECORDER: Recorder | None = None  # made by main(), on the GPU


class Timed:
    """Stands in for a Triton kernel in the engine's launch code: kernel[grid](...) gains times_ptr."""

    def __init__(self, kernel, kind):
        self.kernel, self.kind = kernel, kind

    def __getitem__(self, grid):
        programs = 1
        for size in grid:
            programs *= size

        def call(*args, **kwargs):
            kind = self.kind(kwargs) if callable(self.kind) else self.kind
            return self.kernel[grid](*args, times_ptr=RECORDER.slice(kind, programs), **kwargs)
        return call


def linear_kind(kw) -> str:
    name = {(1024, 4096, False): "slow qkv", (2048, 1024, False): "slow out", (1024, 2048, False): "fast qkv",
            (1024, 1024, False): "fast out / fast head", (1024, 3072, True): "gate/up", (3072, 1024, False): "down"}
    return name.get((kw["K"], kw["N"], kw["gated"]), f"linear K{kw['K']} N{kw['N']}")


fused_linear._fused_linear = Timed(LINEAR, linear_kind)
decode_attention._attend_split = Timed(ATTEND, lambda kw: "attention (fast)" if kw["direct"] else "attention (slow)")
decode_attention._merge_splits = Timed(MERGE, "merge")


def main(argv=None) -> int:
    from weight_options import weight_config

    from engine import compilation
    from engine.config import EngineConfig
    from engine.loader import load_models
    from engine.runtime.kv_cache import KVCache
    from engine.runtime.step_runner import StepRunner

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=100)
    p.add_argument("--kv", type=int, default=512, help="kv bucket (one of the runner's)")
    p.add_argument("--position", type=int, default=100, help="the row's first position (profile_step's: 100)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    global RECORDER
    RECORDER = Recorder()

    models = load_models(EngineConfig(**weight_config("random", None), device="cuda"))
    model, c = models.model, models.model.config
    cache = KVCache(c.n_layer, 1, c.n_local_heads, 4096, c.head_dim, models.placement.dtype, "cuda")
    policy = compilation.decide("on", torch.device("cuda"))
    runner = StepRunner(model, cache, policy)
    runner.prepare([1])
    assert args.kv in runner.kv_buckets, f"--kv must be a bucket: {runner.kv_buckets}"
    assert args.position + 50 + args.frames < args.kv, "the frames must stay inside the kv bucket"
    RECORDER.used, RECORDER.calls = 0, []
    runner._capture(1, args.kv)  # again: this graph's launches, each with its own slice
    calls = list(RECORDER.calls)
    runner.state.start(0, torch.zeros(c.num_codebooks + 1, dtype=torch.long, device="cuda"), args.position,
                       0.8, 0.8, 1.1, 1)
    for _ in range(50):
        runner.step(1, args.kv)
    frames = []
    for _ in range(args.frames):
        runner.step(1, args.kv)
        torch.cuda.synchronize()
        stamps = RECORDER.buffer[:RECORDER.used * 4].view(-1, 4)[:, :3].cpu()
        frames.append((stamps - stamps.min()).double())  # ns since the frame's first stamp (int64 first: exact)
    times = torch.stack(frames)  # (frames, programs, 3)

    rows, previous_end = [], None
    for kind, offset, programs in calls:
        t = times[:, offset:offset + programs]
        launched, released = t[..., 0].amin(1), t[..., 1].amin(1)
        last_released, ended = t[..., 1].amax(1), t[..., 2].amax(1)
        gap = released - previous_end if previous_end is not None else torch.zeros_like(released)
        rows.append((kind, (released - launched).mean().item(), (ended - released).mean().item(),
                     (last_released - released).mean().item(), gap.mean().item()))
        previous_end = ended
    frame_ns = (times[..., 2].amax(1) - times[..., 0].amin(1)).mean().item()
    steps = times.flatten().diff().abs()
    tick = steps[steps > 0].min().item() if (steps > 0).any() else float("nan")

    by_kind = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for kind, early, exposed, late, gap in rows:
        k = by_kind[kind]
        k[0] += 1
        for i, v in enumerate((early, exposed, late, gap), 1):
            k[i] += v / 1000
    print(f"{torch.cuda.get_device_name()}: {len(calls)} instrumented kernels a frame, first start to last end "
          f"{frame_ns / 1000:.1f} us (mean of {args.frames} frames); timer step seen {tick:.0f} ns")
    print(f"{'kind':24s} {'calls':>5s} {'launched early':>15s} {'exposed':>9s} {'late programs':>14s} {'gap before':>11s}  (us a frame)")
    for kind, (n, early, exposed, late, gap) in sorted(by_kind.items(), key=lambda kv: -kv[1][2] - kv[1][4]):
        print(f"{kind:24s} {n:5d} {early:15.1f} {exposed:9.1f} {late:14.1f} {gap:11.1f}")
    total_exposed = sum(k[2] for k in by_kind.values())
    total_gap = sum(k[4] for k in by_kind.values())
    print(f"exposed {total_exposed:.1f} us + gaps {total_gap:.1f} us = {total_exposed + total_gap:.1f} us")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "kv": args.kv, "frames": args.frames,
                                         "frame_us": frame_ns / 1000, "timer_step_ns": tick,
                                         "kernels": [dict(zip(("kind", "early_ns", "exposed_ns", "late_ns", "gap_ns"), r))
                                                     for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
