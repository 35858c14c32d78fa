"""Session s42: which part makes the last row of a 3-row codec call differ from a lone decoder on
the GPU (queue_debug.py: rows 1-3 decoded together, row 3 off by 14-16% of its peak, rows 1-2 exact).
Each case decodes 4 then 8 frames of rows together and prints each row's largest difference from a
lone eager decoder, relative to the lone row's peak. Run from the repository root on a CUDA machine."""
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from engine.config import EngineConfig  # noqa: E402
from engine.loader import load_models  # noqa: E402
from engine.model.codec_stream import Rows, StreamingDecoder  # noqa: E402
from engine.runtime.codec_runner import CodecRunner  # noqa: E402
from engine.runtime.scheduler import Harvest  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
if "--no-tf32" in sys.argv:  # cuDNN's fp32 convolutions too (TF32 by default)
    torch.backends.cudnn.allow_tf32 = False
codec_bf16 = load_models(EngineConfig(demo=True, device="cuda")).codec
gen = torch.Generator().manual_seed(3)
streams = {row: torch.cat([torch.randint(0, 4096, (1, 12), generator=gen),
                           torch.randint(0, 1024, (9, 12), generator=gen)]).cuda() for row in range(8)}
SPANS = [(0, 4), (4, 8)]


def lone_audio(codec):
    out = {}
    for row, codes in streams.items():
        d = StreamingDecoder(codec)
        out[row] = np.concatenate([d.decode(codes[None, :, a:a + n])[0, 0].cpu().numpy() for a, n in SPANS])
    return out


def report(name, got, lone):
    errors = {row: round(float(np.abs(got[row] - lone[row]).max() / np.abs(lone[row]).max()), 4) for row in got}
    print(f"{name}: {errors}", flush=True)


def eager(codec, rows, lone, graph_like_host):
    d = StreamingDecoder(codec, batch=9)
    d.reserve(300)
    d.reset(rows)
    pieces = {row: [] for row in rows}
    with torch.inference_mode():
        for a, n in SPANS:
            codes = torch.stack([streams[r][:, a:a + n] for r in rows])
            host = np.full(len(rows), 8) if graph_like_host else np.asarray(rows)
            audio = d.decode_rows(codes, Rows(torch.tensor(rows, device="cuda"), host))[:, 0]
            for i, r in enumerate(rows):
                pieces[r].append(audio[i].cpu().numpy())
    report(f"eager rows {rows} host {'spare' if graph_like_host else 'rows'}",
           {r: np.concatenate(p) for r, p in pieces.items()}, lone)


def graphed(codec, slots, rows, lone):
    runner = CodecRunner(codec, rows=slots, max_frames=256)
    runner.prepare()
    sizes = []
    decode = runner._decode
    runner._decode = lambda codes, r, last=False: sizes.append(len(r)) or decode(codes, r, last)
    pieces = {row: [] for row in rows}
    with torch.inference_mode():
        for a, n in SPANS:
            runner.submit([Harvest(r, r, streams[r][:, a:a + n], first=a == 0, final=False) for r in rows])
            while runner.pending:
                for item in runner.completed(wait=True):
                    pieces[item.owner].append(item.audio)
    report(f"graphs slots {slots} rows {rows} (calls of {sizes})", {r: np.concatenate(p) for r, p in pieces.items()},
           lone)


# (the demo codec loads in fp32 on a GPU: the first case's label is the config's default, "bf16")
for label, codec in [("bf16", codec_bf16), ("fp32", None)][:1 if "--first" in sys.argv else 2]:
    if codec is None:
        codec = load_models(EngineConfig(demo=True, device="cuda", precision="fp32")).codec
    print(f"== {label} codec ({next(codec.parameters()).dtype})", flush=True)
    lone = lone_audio(codec)
    for rows in ([1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3, 4]):
        eager(codec, rows, lone, False)
    eager(codec, [1, 2, 3], lone, True)
    graphed(codec, 4, [1, 2, 3], lone)
    graphed(codec, 8, [1, 2, 3], lone)
    graphed(codec, 8, [0, 1, 2, 3], lone)
    graphed(codec, 8, [0, 1, 2, 3, 4], lone)
    graphed(codec, 8, [0, 1, 2, 3, 4, 5, 6], lone)
