#!/usr/bin/env python
"""How long the GPU worker's host-side work takes while the web server parses request bodies in
the same process (CPU only; no GPU, no server).

    python scripts/gil_convoy.py [--ops 600] [--intervals 5,0.5,0.1,0.05] [--parser full|json|base64] [--json out.json]

The worker makes many short calls that release Python's GIL (each torch operation does; a
single-row prefill makes several hundred), the "parser" thread parses the load test's request bodies
as the server does (json, then the API's request model, which base64-decodes an inline clip). Each
time the worker releases the GIL the parser takes it, and the worker gets it back only once the
parser's current C call returns or the switch interval forces a hand-over. Printed per switch
interval: the worker's calls alone and beside the parser, and the parser's bodies per second.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=600, help="GIL-releasing calls per worker run (a prefill's order)")
    p.add_argument("--intervals", default="5,0.5,0.1,0.05", help="switch intervals to try, in ms")
    p.add_argument("--parser", choices=["full", "json", "base64"], default="full",
                   help="what the parser thread does: the server's whole parse, json.loads alone, or the "
                        "inline clip's base64 decoding alone")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    import torch

    from app.api_schema import TTSRequest
    from app.body import validate
    from load_test import request_body

    torch.set_num_threads(1)
    # One request of each kind (saved voice, 10 s inline clip, no voice), as the load test sends them.
    load_args = SimpleNamespace(max_new_tokens=215, reference_seconds=10.0, distinct_clips=0, length_spread=0.0)
    bodies = [json.dumps(request_body(n, load_args)).encode() for n in range(3)]
    tensor = torch.ones(8)

    def worker_ms() -> float:
        started = time.perf_counter()
        for _ in range(args.ops):
            torch.add(tensor, 1)
        return (time.perf_counter() - started) * 1000

    clip = json.loads(bodies[1])["references"][0]["audio"]
    parse_one = {"full": lambda body: validate(TTSRequest, json.loads(body)),
                 "json": json.loads,
                 "base64": lambda body: base64.b64decode(clip, validate=True)}[args.parser]

    def parse_until(stop: threading.Event, parsed: list[int]) -> None:
        while not stop.is_set():
            for body in bodies:
                parse_one(body)
                parsed[0] += 1

    def parser_beside(fn) -> tuple[object, float]:
        """fn()'s result while a parser thread runs, and the parser's bodies per second meanwhile."""
        stop, parsed = threading.Event(), [0]
        thread = threading.Thread(target=parse_until, args=(stop, parsed))
        thread.start()
        time.sleep(0.05)
        started, before = time.perf_counter(), parsed[0]
        result = fn()
        rate = (parsed[0] - before) / (time.perf_counter() - started)
        stop.set()
        thread.join()
        return result, rate

    previous = sys.getswitchinterval()
    rows = []
    try:
        for interval_ms in (float(x) for x in args.intervals.split(",")):
            sys.setswitchinterval(interval_ms / 1000)
            alone = sorted(worker_ms() for _ in range(args.repeats))[args.repeats // 2]
            beside, rate_beside = parser_beside(lambda: sorted(worker_ms() for _ in range(args.repeats))[args.repeats // 2])
            _, rate_alone = parser_beside(lambda: time.sleep(0.5))
            rows.append({"switch_interval_ms": interval_ms, "worker_ms_alone": alone, "worker_ms_beside_parser": beside,
                         "parser_bodies_per_s_beside_worker": rate_beside, "parser_bodies_per_s_alone": rate_alone})
            print(f"switch interval {interval_ms:5.2f} ms: {args.ops} calls {alone:6.2f} ms alone, {beside:7.1f} ms beside "
                  f"the parser (median of {args.repeats}); parser {rate_beside:5.0f} bodies/s beside, {rate_alone:5.0f} alone")
    finally:
        sys.setswitchinterval(previous)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"ops": args.ops, "parser": args.parser, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
