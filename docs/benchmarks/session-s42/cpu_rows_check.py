"""Session s42: rows_debug.py's question on the CPU. The demo codec decodes the queue test's four
streams (seed 3; 4 then 8 frames) in batches of rows. Each stream is compared with a lone decoder,
as its largest difference relative to the lone stream's peak.

    python docs/benchmarks/session-s42/cpu_rows_check.py          # the decode path in fp32 (the CPU's)
    python docs/benchmarks/session-s42/cpu_rows_check.py --bf16   # in bf16, as on a GPU (loader._place_codec)

With --bf16 it then finds the first layer whose output for stream 3 differs between a lone decoder
and a call of rows 2 and 3 (the first chunk), and how many of its elements differ.

In fp32 the host's rows are set as a graph sets them (the spare row), as in rows_debug.py's
"host spare" case."""
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from engine.config import EngineConfig  # noqa: E402
from engine.loader import load_models  # noqa: E402
from engine.model.codec_stream import Rows, StreamingDecoder  # noqa: E402

SPANS = [(0, 4), (4, 8)]
SPARE = 4

codec = load_models(EngineConfig(demo=True, device="cpu")).codec
bf16 = "--bf16" in sys.argv
if bf16:
    codec.decode_in(torch.bfloat16)
gen = torch.Generator().manual_seed(3)
streams = [torch.cat([torch.randint(0, 4096, (1, 12), generator=gen), torch.randint(0, 1024, (9, 12), generator=gen)])
           for _ in range(4)]
lone = []
for codes in streams:
    d = StreamingDecoder(codec)
    lone.append(torch.cat([d.decode(codes[None, :, a:a + n])[0, 0] for a, n in SPANS]).float())

for rows in ([3], [2, 3], [1, 2, 3], [0, 1, 2, 3]):
    decoder = StreamingDecoder(codec, batch=SPARE + 1)
    decoder.reserve(300)
    decoder.reset(rows)
    # As a graph replays: the device's rows, the host's all the spare one.
    selected = Rows(torch.tensor(rows), np.full(len(rows), SPARE)) if not bf16 else None
    with torch.inference_mode():
        pieces = []
        for a, n in SPANS:
            codes = torch.stack([streams[r][:, a:a + n] for r in rows])
            pieces.append(decoder.decode_rows(codes, selected) if selected is not None else decoder.decode(codes, rows))
    got = torch.cat(pieces, -1)[:, 0].float()
    print(f"{'bf16' if bf16 else 'fp32'} rows {rows}:",
          {r: round(float((got[i] - lone[r]).abs().max() / lone[r].abs().max()), 5) for i, r in enumerate(rows)})
for r, x in enumerate(lone):
    print(f"stream {r}: peak {x.abs().max():.3f}, rms {x.pow(2).mean().sqrt():.3f}, "
          f"samples at |x| >= 0.999: {(x.abs() >= 0.999).float().mean():.3f}")


def layer_outputs(rows: list[int], batch: int) -> list[tuple[str, torch.Tensor]]:
    """Every streamed layer's output for the first chunk of `rows`, decoded by a decoder of `batch` rows."""
    outputs = []
    steps = {}
    for cls in (cs._Transformer, cs._Conv, cs._ConvTranspose, cs._FusedResidual, cs._ConvNeXt, cs._Stateless):
        steps[cls] = cls.step
        cls.step = (lambda f, name: lambda self, x, r: outputs.append((name, f(self, x, r))) or outputs[-1][1])(
            cls.step, cls.__name__)
    try:
        decoder = StreamingDecoder(codec, batch=batch)
        with torch.inference_mode():
            decoder.decode(torch.stack([streams[r][:, :4] for r in rows]), rows if batch > 1 else None)
    finally:
        for cls, step in steps.items():
            cls.step = step
    return [(name, y.float()) for name, y in outputs]


if bf16:
    from engine.model import codec_stream as cs

    alone, paired = layer_outputs([3], 1), layer_outputs([2, 3], SPARE + 1)
    for i, ((name, a), (_, b)) in enumerate(zip(alone, paired)):
        if not torch.equal(a[0], b[1]):
            last_a, last_b = alone[-1][1][0], paired[-1][1][1]
            print(f"first difference: layer {i} of {len(alone)} ({name}), {int((a[0] != b[1]).sum())} of "
                  f"{a[0].numel()} elements, by {float((a[0] - b[1]).abs().max())} (the layer's peak "
                  f"{float(a[0].abs().max()):.2f}); the last layer's output differs by "
                  f"{float((last_a - last_b).abs().max() / last_a.abs().max()):.4f} of its peak")
            break
