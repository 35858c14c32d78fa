#!/usr/bin/env python
"""How long a reference clip takes to encode: eagerly and through the reference encoder's CUDA graph.

    python scripts/profile_encode.py --weights random [--seconds 10] [--chunks 32,64] [--json out.json]

For each chunk size (frames encoded at a time): the time per clip eagerly and replayed as one CUDA
graph per chunk (CUDA only), the memory the graph keeps, the peak above the model, and whether the
graph gives the eager codes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from weight_options import add_weight_options, parse_with_weights, weight_config  # noqa: E402  (this script's folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weight_options(p, demo=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seconds", type=float, default=10.0, help="clip length")
    p.add_argument("--chunks", default="32,64", help="frames encoded at a time")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = parse_with_weights(p, argv)

    import numpy as np
    import torch

    from engine.config import EngineConfig
    from engine.loader import load_models
    from engine.runtime.reference_encoder import ReferenceEncoder

    codec = load_models(EngineConfig(**weight_config(args.weights, args.checkpoint), device=args.device)).codec
    cuda = next(codec.parameters()).device.type == "cuda"
    t = np.arange(int(44100 * args.seconds)) / 44100
    clip = (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32)
    frames_limit = int(np.ceil(len(clip) / codec.config.frame_length))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    rows = []
    for chunk in [int(c) for c in args.chunks.split(",")]:
        eager_codes = None
        for graphed in ([False, True] if cuda else [False]):
            encoder = ReferenceEncoder(codec, chunk, max_frames=frames_limit)
            sync()
            base = torch.cuda.memory_allocated() if cuda else 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            if graphed:
                encoder.prepare()
            held = (torch.cuda.memory_allocated() - base) if cuda else 0
            codes = encoder.encode(clip)  # settle
            sync()
            started = time.perf_counter()
            for _ in range(args.repeats):
                encoder.encode(clip)
            sync()
            row = {"chunk_frames": chunk, "graphed": graphed,
                   "ms_per_clip": (time.perf_counter() - started) / args.repeats * 1000,
                   "graph_held_gb": held / 1e9,
                   "peak_above_model_gb": ((torch.cuda.max_memory_allocated() - base) / 1e9) if cuda else None}
            if graphed:
                row["same_codes_as_eager"] = bool(torch.equal(codes, eager_codes))
            else:
                eager_codes = codes
            rows.append(row)
            print(f"chunk {chunk:4d} {'graph' if graphed else 'eager'}: {row['ms_per_clip']:7.1f} ms per "
                  f"{args.seconds:g} s clip" + (f", graph keeps {held / 1e9:.2f} GB, peak +{row['peak_above_model_gb']:.2f} GB"
                                               if cuda else "")
                  + (f", same codes as eager: {row['same_codes_as_eager']}" if graphed else ""))
    if args.json:
        device = torch.cuda.get_device_name(0) if cuda else args.device
        args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "seconds": args.seconds,
                                         "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
