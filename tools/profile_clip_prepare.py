#!/usr/bin/env python
"""What an uploaded reference clip costs on the thread that takes the request, before the engine
sees it: decoding the file's bytes to 44.1 kHz mono and hashing the samples (the codes cache's key),
as TTSEngine does for every clip it has not decoded before. Timed alone and beside threads that run
Python without pause, as the GPU worker does under load: every time the decode lets go of the GIL (a
C call, a numpy pass) it waits to take it back, up to a switch interval (5 ms) each time.

    python tools/profile_clip_prepare.py [--seconds 10] [--formats wav,flac,ogg,mp3] \
        [--busy-threads 1] [--repeats 9] [--json out.json]

Each format is timed as the engine reads uploads and, for comparison, from a Python file object (how
libsndfile reads them where there are no memory files: it then calls back into Python for every 8 KB).
Needs no GPU and no model.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine import audio  # noqa: E402
from engine.references import content_hash  # noqa: E402

SUBTYPES = {"wav": "PCM_16", "flac": "PCM_16", "ogg": "VORBIS", "mp3": "MPEG_LAYER_III"}


def clip_bytes(fmt: str, seconds: float) -> bytes:
    """A voiced-like test signal (a gliding tone with a little noise) as file bytes."""
    t = np.arange(int(audio.SAMPLE_RATE * seconds)) / audio.SAMPLE_RATE
    signal = 0.3 * np.sin(2 * np.pi * (140 + 30 * np.sin(np.pi * t)) * t)
    signal += 0.02 * np.random.default_rng(0).standard_normal(len(t))
    buffer = io.BytesIO()
    sf.write(buffer, signal.astype(np.float32), audio.SAMPLE_RATE, format=fmt.upper(), subtype=SUBTYPES[fmt])
    return buffer.getvalue()


def prepare(data: bytes) -> str:
    """The engine's work for a new upload: decode, then the samples' hash."""
    return content_hash(audio.load_audio(data, max_seconds=90))


@contextlib.contextmanager
def busy_threads(count: int):
    """`count` threads running Python without pause until the block ends."""
    stop = threading.Event()

    def spin():
        total = 0
        while not stop.is_set():
            for i in range(1000):
                total += i

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def timed_ms(data: bytes, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        prepare(data)
        times.append((time.perf_counter() - started) * 1e3)
    return {"p50": round(statistics.median(times), 2), "max": round(max(times), 2)}


def from_a_file_object():
    """libsndfile reading uploads from a Python file object, as where there are no memory files."""
    return mock.patch.object(audio, "_readable_by_path", lambda data: contextlib.nullcontext(io.BytesIO(data)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each clip, in seconds")
    p.add_argument("--formats", default="wav,flac,ogg,mp3", help="comma-separated: " + ", ".join(SUBTYPES))
    p.add_argument("--busy-threads", type=int, default=1, help="threads running Python beside the decode")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in formats if f not in SUBTYPES]
    if unknown or not formats or args.seconds <= 0 or args.repeats < 1 or args.busy_threads < 0:
        p.error(f"--formats takes {', '.join(SUBTYPES)}; --seconds > 0, --repeats >= 1, --busy-threads >= 0")
    results = {}
    for fmt in formats:
        try:
            data = clip_bytes(fmt, args.seconds)
        except (sf.LibsndfileError, TypeError, ValueError) as exc:  # an old libsndfile without MP3
            print(f"{fmt}: this libsndfile cannot write it ({exc}); skipped", file=sys.stderr)
            continue
        prepare(data)  # first-call costs (imports, soxr's plans) out of the timings
        row = {"bytes": len(data)}
        for path, reading in (("engine", contextlib.nullcontext), ("file_object", from_a_file_object)):
            with reading():
                row[f"{path}_alone_ms"] = timed_ms(data, args.repeats)
                with busy_threads(args.busy_threads):
                    row[f"{path}_beside_busy_ms"] = timed_ms(data, args.repeats)
        results[fmt] = row
        print(f"{fmt} ({len(data) / 1e6:.2f} MB): as the engine reads uploads {row['engine_alone_ms']['p50']:.1f} ms "
              f"alone, {row['engine_beside_busy_ms']['p50']:.1f} ms beside {args.busy_threads} busy thread(s); "
              f"from a file object {row['file_object_alone_ms']['p50']:.1f} and "
              f"{row['file_object_beside_busy_ms']['p50']:.1f} ms (p50 of {args.repeats})")
    report = {"seconds": args.seconds, "busy_threads": args.busy_threads, "repeats": args.repeats,
              "switch_interval_ms": sys.getswitchinterval() * 1e3, "python": sys.version.split()[0],
              "libsndfile": sf.__libsndfile_version__, "formats": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
