#!/usr/bin/env python
"""Where the GPU worker's wall time goes, call by call: run a script with the worker's parts and
Python's garbage collector timed, and write every span as JSON; or summarise such a file.

    python tools/trace_worker.py --out trace.json launch.py --random-weights --no-ui   # load it, then Ctrl+C
    python tools/trace_worker.py --out trace.json scripts/load_test.py --in-process --levels 64
    python tools/trace_worker.py --summary trace.json   # per span; per burst of >= 16 requests (--out and
                                                        # --summary take .json.gz too)
    python tools/trace_worker.py --summary trace.json --window 136.3 150.3   # the spans of one stretch
    python tools/trace_worker.py --gpu-events --out trace.json launch.py ...   # and the GPU's busy time (CUDA)

Each span is [name, thread, start s, end s, before, after] (seconds from the script's start; before
and after: what the part saw, e.g. admission's (running, waiting, deferred steps), a step's batch,
a garbage collection's generation and objects collected). The file is written when the script
exits, Ctrl+C included. A few microseconds per timed call: compare traced runs with traced runs.

With --gpu-events (CUDA), the GPU work the worker queues (batched steps, prefills, codec calls) is
also bracketed by CUDA events, written as spans of thread "gpu" on the same clock (`gpu_step`
(batch, kv needed), `gpu_prefill`, `gpu_codec` (rows, frames), `gpu_encode` (a pass of reference
clips: clips, frames of the longest)): a span runs from when its stream reached the call's first
work to when it finished the call's last. The codec's and the encoder's streams take turns on the
GPU with the steps', so their spans also cover the steps run inside them; the union of all spans is
the time the GPU had work, and the summary gives the rest as the GPU's idle share.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import gzip
import json
import os
import runpy
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the engine: summaries use its buckets


def job_id(owner) -> int | None:
    """The id of the worker's job a sequence's owner (a request) runs for, as `job_run` records it."""
    job = getattr(owner, "job", None)
    return None if job is None else id(job)


# (module, class, method, span name, what to record before and after the call)
TIMED = [
    ("engine.runtime.worker", "GPUWorker", "submit", "job_submit", None),
    ("engine.runtime.worker", "GPUWorker", "_run", "job_run", lambda s, a: id(a[0])),
    ("engine.core", "EngineCore", "step", "iterate",
     lambda s, a: (s.scheduler.running, s.scheduler.waiting)),
    ("engine.runtime.decode_loop", "DecodeLoop", "_admit", "admit",
     lambda s, a: (len(s.scheduler._running), len(s.scheduler._waiting), s.scheduler._deferred)),
    ("engine.runtime.batch_runner", "BatchRunner", "step", "step", lambda s, a: a[0]),
    ("engine.runtime.batch_runner", "BatchRunner", "admit", "start",
     lambda s, a: [[x.slot, job_id(x.owner)] for x in a[0]]),
    ("engine.runtime.batch_runner", "BatchRunner", "stop", "retire", lambda s, a: list(a[0])),
    ("engine.runtime.batch_runner", "FrameCounts", "wait", "frame_counts_wait", None),
    ("engine.runtime.step_runner", "StepRunner", "prefill_many", "prefill_many", lambda s, a: len(a[0])),
    ("engine.runtime.step_runner", "StepRunner", "prefill", "prefill", None),
    ("engine.runtime.prefix_cache", "PrefixCache", "place", "prefix_place", lambda s, a: len(a[0])),
    ("engine.runtime.codec_runner", "CodecRunner", "submit", "codec_submit", lambda s, a: len(a[0])),
    ("engine.runtime.codec_runner", "CodecRunner", "completed", "codec_completed", None),
    ("engine.facade", "TTSEngine", "_prepare", "request_prepare", None),
    ("engine.core", "RequestRun", "deliver", "deliver", lambda s, a: [job_id(s), a[1], bool(a[2])]),
]


# (module, class, method, span name, what to record): GPU work bracketed by CUDA events (--gpu-events)
GPU_TIMED = [
    ("engine.runtime.step_runner", "StepRunner", "step", "gpu_step", lambda s, a: [a[0], a[1]]),
    ("engine.runtime.step_runner", "StepRunner", "prefill_many", "gpu_prefill", lambda s, a: len(a[0])),
    ("engine.runtime.step_runner", "StepRunner", "prefill", "gpu_prefill", lambda s, a: 1),
    ("engine.runtime.codec_runner", "CodecRunner", "_decode", "gpu_codec",
     lambda s, a: [len(a[1]), int(a[0].shape[-1])]),
    ("engine.runtime.reference_encoder", "ReferenceEncoder", "_encode", "gpu_encode", lambda s, a: [len(a[0]), a[1]]),
]


class GpuEvents:
    """CUDA events around GPU work, resolved at exit to spans on the recorder's clock. The clock's
    anchor is an event synchronised with the host when the first one is recorded (the GPU is idle
    then, so its time is the host's within microseconds)."""

    def __init__(self, recorder: "Recorder", limit: int = 500_000):
        self.recorder, self.limit = recorder, limit
        self.calls: list[tuple[str, object, object, object]] = []  # (name, start event, end event, seen)
        self._anchor: tuple[object, float] | None = None

    def time_method(self, owner: type, method: str, name: str, observe) -> None:
        import torch

        original = getattr(owner, method)

        def timed(obj, *args, **kwargs):
            if len(self.calls) >= self.limit or not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
                return original(obj, *args, **kwargs)
            if self._anchor is None:
                anchor = torch.cuda.Event(enable_timing=True)
                anchor.record()
                anchor.synchronize()
                self._anchor = (anchor, time.perf_counter() - self.recorder.origin)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                return original(obj, *args, **kwargs)
            finally:
                end.record()
                self.calls.append((name, start, end, observe(obj, args)))

        setattr(owner, method, timed)

    def spans(self) -> list[list]:
        if self._anchor is None:
            return []
        import torch

        torch.cuda.synchronize()
        anchor, at = self._anchor
        return [[name, "gpu", round(at + anchor.elapsed_time(start) / 1000, 6),
                 round(at + anchor.elapsed_time(end) / 1000, 6), seen, None]
                for name, start, end, seen in self.calls]


class Recorder:
    def __init__(self, gpu_events: bool = False):
        self.origin = time.perf_counter()
        self.spans: list[list] = []
        self._gc_started: float | None = None
        self.gpu = GpuEvents(self) if gpu_events else None

    def add(self, name: str, started: float, before=None, after=None) -> None:
        self.spans.append([name, threading.current_thread().name, round(started - self.origin, 6),
                           round(time.perf_counter() - self.origin, 6), before, after])

    def time_method(self, owner: type, method: str, name: str, observe) -> None:
        original = getattr(owner, method)

        def timed(obj, *args, **kwargs):
            started = time.perf_counter()
            before = observe(obj, args) if observe else None
            try:
                return original(obj, *args, **kwargs)
            finally:
                self.add(name, started, before, observe(obj, args) if observe else None)

        setattr(owner, method, timed)

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.add("gc", self._gc_started, info.get("generation"), info.get("collected"))

    def install(self) -> None:
        import importlib

        for module, cls, method, name, observe in TIMED:
            self.time_method(getattr(importlib.import_module(module), cls), method, name, observe)
        if self.gpu is not None:  # around the host spans' wrappers (a few microseconds of host time)
            for module, cls, method, name, observe in GPU_TIMED:
                self.gpu.time_method(getattr(importlib.import_module(module), cls), method, name, observe)
        gc.callbacks.append(self.on_gc)

    def write(self, path: Path) -> None:
        if self.gpu is not None:
            self.spans += self.gpu.spans()
        with open_trace(path, "wt") as f:
            json.dump(self.spans, f)
        print(f"trace: {len(self.spans)} spans written to {path}", file=sys.stderr)


def open_trace(path: Path, mode: str):
    """A trace file, gzip-compressed when its name ends in .gz (large traces are kept so)."""
    return (gzip.open if path.suffix == ".gz" else open)(path, mode)


def summarise(spans: list[list]) -> str:
    lines = []
    collections = [s for s in spans if s[0] == "gc"]
    for generation in sorted({s[4] for s in collections}):
        ms = [(s[3] - s[2]) * 1000 for s in collections if s[4] == generation]
        lines.append(f"gc generation {generation}: {len(ms)} collections, {sum(ms):.1f} ms in all, longest {max(ms):.1f} ms")
    lines.append(f"{'span':20s} {'calls':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>9s} {'total s':>8s}")
    for name in sorted({s[0] for s in spans} - {"gc"}):
        ms = sorted((s[3] - s[2]) * 1000 for s in spans if s[0] == name)
        lines.append(f"{name:20s} {len(ms):7d} {nearest_rank(ms, 0.5):8.2f} {nearest_rank(ms, 0.99):8.2f} "
                     f"{ms[-1]:9.1f} {sum(ms) / 1000:8.2f}")
    for start, end, requests in bursts(spans):
        inside = [s for s in spans if start <= s[2] <= end + 1.0]
        prefills = [s[3] - s[2] for s in inside if s[0] in ("prefill", "prefill_many")]
        jobs = [s[3] - s[2] for s in inside if s[0] == "job_run"]
        first_admit = min((s[2] for s in inside if s[0] == "admit" and s[5] and s[5][0] > s[4][0]), default=None)
        collections_ms = [(s[3] - s[2]) * 1000 for s in inside if s[0] == "gc"]
        lines.append(f"burst at {start:.2f} s: {requests} requests over {(end - start) * 1000:.0f} ms; first admission "
                     + (f"{(first_admit - start) * 1000:.0f} ms after the first request" if first_admit else "none")
                     + f"; longest prefill call {max(prefills, default=0) * 1000:.0f} ms; longest job (a request's "
                     f"set-up) {max(jobs, default=0) * 1000:.0f} ms; longest collection "
                     f"{max(collections_ms, default=0):.1f} ms")
    lines += load_lines(spans)
    lines += pace_lines(spans)
    lines += gpu_lines(spans)
    busy = sorted((s for s in spans if s[0] == "iterate" and s[4] and s[4][0]), key=lambda s: s[2] - s[3])[:5]
    if busy:  # sequences were running: every other stream waited this long for its next frame
        lines.append("longest iterations while sequences ran (ms, running, waiting): " + ", ".join(
            f"{(s[3] - s[2]) * 1000:.0f} at {s[2]:.2f} s ({s[4][0]}, {s[4][1]})" for s in busy))
    return "\n".join(lines)


def nearest_rank(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, the nearest rank below: every percentile here is taken so, which
    keeps a higher one from falling below a lower one (an interpolated median beside a nearest-rank
    90th did, for two values)."""
    return ordered[int(q * (len(ordered) - 1))]


def p50_p90(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return nearest_rank(ordered, 0.5), nearest_rank(ordered, 0.9)


def load_lines(spans: list[list]) -> list[str]:
    """How full the batched steps and the codec's calls were: rows per step, free slots at each
    admission (while requests waited for one, and while none did), how long a slot stood empty
    between a sequence's retirement and the next one's start there, rows per codec call."""
    lines = []
    steps = [s[4] for s in spans if s[0] == "step" and s[4]]
    if steps:
        lines.append(f"steps: {len(steps)} with sequences, {statistics.mean(steps):.1f} rows on average, "
                     f"{max(steps)} at most")
    admits = [s[4] for s in spans if s[0] == "admit" and s[4]]
    calls = [s[4] for s in spans if s[0] == "codec_submit" and s[4]]
    slots = max([*steps, *(r for r, _, _ in admits), *calls], default=0)  # the most rows seen
    if admits:
        waited = sum(min(w, slots - r) for r, w, _ in admits)
        idle = sum(max(0, slots - r - w) for r, w, _ in admits)
        lines.append(f"free slots per iteration (of {slots}, the most rows seen): {waited / len(admits):.2f} while "
                     f"requests waited, {idle / len(admits):.2f} while none did")
    retired, empty_ms = {}, []  # retired: slot -> when its sequence left
    for name, _, start, end, seen, _ in sorted((s for s in spans if s[0] in ("retire", "start")), key=lambda s: s[2]):
        if name == "retire":  # seen: the slots
            retired.update(dict.fromkeys(seen, end))
        else:  # seen: [slot, job id] of each sequence started
            empty_ms += [(start - retired.pop(slot)) * 1000 for slot, _ in seen if slot in retired]
    if empty_ms:
        p50, p90 = p50_p90(empty_ms)
        lines.append(f"a slot empty from a retirement to the next start there: {len(empty_ms)} times, p50 "
                     f"{p50:.0f} ms, p90 {p90:.0f} ms")
    if calls:
        from engine.runtime.codec_runner import codec_row_buckets
        from engine.runtime.step_runner import bucket_for

        buckets = codec_row_buckets(slots)  # the codec runner's graphs' row buckets, for that many slots
        padded = sum(bucket_for(rows, buckets) for rows in calls)
        lines.append(f"codec calls: {len(calls)}, {statistics.mean(calls):.1f} rows on average "
                     f"({sum(calls)} rows, {padded} with their buckets' padding)")
    return lines


def pace_lines(spans: list[list]) -> list[str]:
    """How fast the steps came and what held the host: batched steps per second; the host's work
    between two read-backs of frame counts (while it works, the GPU runs only the steps queued
    before: Scheduler.read_back_lag); a request's wait from the worker taking it to its first start
    in a slot; a slot's empty time split at the moment the worker took the request that next
    starts there: before it, the last audio and the client's turn; after it, that request's own wait;
    and of the client's turn, a sequence's retirement to its last audio handed to its request (the
    final codec call)."""
    lines = []
    steps = sorted(s[2] for s in spans if s[0] == "step" and s[4])
    if len(steps) > 1:
        lines.append(f"batched steps: {(len(steps) - 1) / (steps[-1] - steps[0]):.0f} a second")
    waits = sorted((s[2], s[3]) for s in spans if s[0] == "frame_counts_wait")
    if len(waits) > 1:
        p50, p90 = p50_p90([(nxt[0] - prev[1]) * 1000 for prev, nxt in zip(waits, waits[1:])])
        lines.append(f"host work between two frame-count read-backs: p50 {p50:.1f} ms, p90 {p90:.1f} ms")
    taken: dict[int, float] = {}  # job id -> when the worker took it, until its first start
    retired: dict[int, float] = {}  # slot -> when its sequence left
    running: dict[int, int] = {}  # slot -> the job id of the sequence started there
    ended: dict[int, float] = {}  # job id -> when its sequence left its slot, until its last audio
    to_start_ms, before_ms, after_ms, last_audio_ms = [], [], [], []
    events = sorted((s for s in spans if s[0] in ("job_run", "retire", "start", "deliver")), key=lambda s: s[2])
    for name, _, start, end, seen, _ in events:
        if name == "job_run":  # an id is reused only after its job is gone: the latest run is its job's
            taken[seen] = start
        elif name == "deliver":  # seen: job id, frames, whether it ends the sequence's audio
            if seen[2] and seen[0] in ended:
                last_audio_ms.append((start - ended.pop(seen[0])) * 1000)
        elif name == "retire":
            retired.update(dict.fromkeys(seen, end))
            ended.update({running.pop(slot): end for slot in seen if slot in running})
        else:
            running.update({slot: job for slot, job in seen if job is not None})
            for slot, job in seen:
                left = retired.pop(slot, None)
                took = taken.pop(job, None) if job is not None else None
                if took is None:  # a later text chunk of its request, or a job from before the trace
                    continue
                to_start_ms.append((start - took) * 1000)
                if left is not None:
                    before_ms.append(max(0.0, took - left) * 1000)
                    after_ms.append((start - max(took, left)) * 1000)
    if to_start_ms:
        p50, p90 = p50_p90(to_start_ms)
        lines.append(f"a request from the worker taking it to its first start in a slot (its clips' encodes, "
                     f"admission, prefill): p50 {p50:.0f} ms, p90 {p90:.0f} ms")
    if before_ms:
        (b50, b90), (a50, a90) = p50_p90(before_ms), p50_p90(after_ms)
        lines.append(f"a slot's empty time until the worker took its next request (the last audio, the client's "
                     f"turn): p50 {b50:.0f} ms, p90 {b90:.0f} ms; from then to its start: p50 {a50:.0f} ms, p90 {a90:.0f} ms")
    if last_audio_ms:
        p50, p90 = p50_p90(last_audio_ms)
        lines.append(f"a sequence's retirement to its last audio handed to its request: p50 {p50:.0f} ms, p90 {p90:.0f} ms")
    return lines


def covered(spans: list[list]) -> tuple[float, list[float]]:
    """The seconds the spans (sorted by start) cover together, and the gaps between them (ms, sorted)."""
    busy, gaps = 0.0, []
    start, end = spans[0][2], spans[0][3]
    for s in spans[1:]:
        if s[2] > end:
            busy += end - start
            gaps.append((s[2] - end) * 1000)
            start = s[2]
        end = max(end, s[3])
    return busy + end - start, sorted(gaps)


def gpu_lines(spans: list[list]) -> list[str]:
    """From --gpu-events spans: the share of the time the GPU had work queued (the union of the
    spans, from the first one's start to the last one's end) and its idle gaps; a step's and a codec
    call's span (a codec span includes the steps that ran inside it), and the share of the time the
    codec's stream had a call (near all of it means the codec is behind the decode steps)."""
    gpu = sorted((s for s in spans if s[1] == "gpu"), key=lambda s: s[2])
    if not gpu:
        return []
    busy, gaps = covered(gpu)
    total = max(s[3] for s in gpu) - gpu[0][2]
    lines = [f"GPU with work: {100 * busy / total:.1f}% of {total:.2f} s; idle {total - busy:.3f} s in {len(gaps)} gaps "
             f"({sum(g > 1 for g in gaps)} over 1 ms, longest {gaps[-1] if gaps else 0:.1f} ms)"]
    codec_spans = [s for s in gpu if s[0] == "gpu_codec"]
    if codec_spans:
        lines.append(f"the codec's stream with a call: {100 * covered(codec_spans)[0] / total:.1f}% of the time")
    steps = sorted((s[3] - s[2]) * 1000 for s in gpu if s[0] == "gpu_step")
    if steps:
        lines.append(f"gpu_step: {len(steps)} spans, p50 {nearest_rank(steps, 0.5):.2f} ms")
    codec: dict[int, list[tuple[float, int]]] = {}
    for s in gpu:
        if s[0] == "gpu_codec":
            codec.setdefault(s[4][1], []).append(((s[3] - s[2]) * 1000, s[4][0]))
    for frames, calls in sorted(codec.items()):
        ms = sorted(m for m, _ in calls)
        lines.append(f"gpu_codec, {frames} frames: {len(calls)} calls of {statistics.mean(r for _, r in calls):.1f} rows, "
                     f"span p50 {nearest_rank(ms, 0.5):.2f} ms")
    passes: dict[int, list[float]] = {}  # clips in a pass -> its spans (ms)
    for s in gpu:
        if s[0] == "gpu_encode":
            passes.setdefault(s[4][0], []).append((s[3] - s[2]) * 1000)
    for clips, ms in sorted(passes.items()):
        p50, p90 = p50_p90(ms)
        lines.append(f"gpu_encode, {clips} clips: {len(ms)} passes, span p50 {p50:.1f} ms, p90 {p90:.1f} ms")
    return lines


def within(spans: list[list], start: float, end: float) -> list[list]:
    """The spans that begin in [start, end] (seconds on the trace's clock)."""
    return [s for s in spans if start <= s[2] <= end]


def bursts(spans: list[list], min_requests: int = 16, window_s: float = 1.0) -> list[tuple[float, float, int]]:
    """(first, last request's submission, requests) for each run of at least min_requests requests
    submitted within window_s of its first."""
    submitted = sorted(s[2] for s in spans if s[0] == "request_prepare")
    found, i = [], 0
    while i < len(submitted):
        j = i
        while j < len(submitted) and submitted[j] - submitted[i] < window_s:
            j += 1
        if j - i >= min_requests:
            found.append((submitted[i], submitted[j - 1], j - i))
            i = j
        else:
            i += 1
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write the spans here, running the script that follows")
    p.add_argument("--summary", type=Path, help="print a summary of a trace file written before")
    p.add_argument("--window", type=float, nargs=2, metavar=("START", "END"),
                   help="with --summary: only the spans that begin between these seconds of the trace")
    p.add_argument("--gpu-events", action="store_true",
                   help="with --out: also bracket the GPU work the worker queues with CUDA events (see above)")
    p.add_argument("script", nargs="?", help="the Python script to run (e.g. launch.py), then its arguments")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.summary:
        with open_trace(args.summary, "rt") as f:
            spans = json.load(f)
        print(summarise(within(spans, *args.window) if args.window else spans))
        return 0
    if not (args.out and args.script):
        p.error("give --out FILE and a script to run (or --summary FILE)")
    recorder = Recorder(gpu_events=args.gpu_events)
    recorder.install()
    atexit.register(recorder.write, args.out)
    script = os.path.abspath(args.script)
    sys.argv = [script, *args.script_args]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
