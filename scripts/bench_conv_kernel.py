"""Time the codec decoder's layers channels-first against the channels-last Triton kernels of
engine/model/conv_kernel.py (the engine's path with Triton), for one codec call of R rows x F frames.

For every residual unit, transposed convolution and the two end convolutions of S1-mini's decoder
(random weights of its shapes), in bf16, each form captured in a CUDA graph:
  engine  (B, C, T) activations, as the engine streams them without Triton: the eager pointwise
          passes, cuDNN or im2col (the faster, as its tuned convolutions choose), the 1x1 conv as a
          matmul (before the channels-last decoder, 1213308, the pointwise passes were Triton kernels
          of their own: docs/PERFORMANCE.md gives both);
  kernel  (B, T, C) activations: the context Snake, then conv_kernel.conv with its epilogues.
--sweep also times the kernel's tile settings per convolution shape and prints the best.

    python scripts/bench_conv_kernel.py --rows 64 --frames 32 [--sweep] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graph_timing import microseconds_per_call  # noqa: E402  (this script's folder)

from engine.model import codec_convs as pointwise, conv_kernel as ck  # noqa: E402
from engine.model.tuned_conv import ShapeTunedConv1d, tuning  # noqa: E402

DTYPE = torch.bfloat16
EPS = 1e-9
LATENT, DIMS, RATES = 1024, (1536, 768, 384, 192, 96), (8, 8, 4, 2)
POSITIONS_PER_FRAME = 4  # decoder input steps per frame (hop 512)
PIECES = False


def milliseconds(fn, repeats: int = 10) -> float:
    """GPU time of one call of fn, replayed from a CUDA graph."""
    return microseconds_per_call(lambda i: fn(), calls=1, replays=repeats) / 1000


def best_conv(x, weight, dilation):
    """The convolution as the engine runs it without Triton: a ShapeTunedConv1d, timed on x's shape."""
    plain = torch.nn.Conv1d(weight.shape[1], weight.shape[0], weight.shape[2], dilation=dilation, bias=False,
                            device="meta")
    plain.weight = torch.nn.Parameter(weight, requires_grad=False)
    conv = ShapeTunedConv1d.like(plain)
    with tuning(conv):
        conv(x)  # cuDNN or im2col, whichever it times faster for this shape
    return conv


def rand(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(DTYPE)


def residual_unit(rows, length, c, dilation):
    """(engine ms, kernel ms, max |difference| / max |engine|)."""
    ctx = 6 * dilation
    w7, w1 = rand(c, c, 7, scale=c ** -0.5 / 3), rand(c, c, 1, scale=c ** -0.5)
    b7, b1, alpha = rand(c, scale=0.1), rand(c, scale=0.1), (torch.rand(c, device="cuda") + 0.5).to(DTYPE)
    x, context = rand(rows, c, length), rand(rows, c, ctx)
    conv7 = best_conv(torch.cat([context, x], -1), w7, dilation)

    def engine():
        full = pointwise.context_snake(context, x, alpha[:, None], EPS)
        y = pointwise.biased_snake(conv7(full), b7, alpha[:, None], EPS)
        return pointwise.biased_residual(x, torch.matmul(w1[..., 0], y), b1)

    x_cl, context_cl = x.transpose(1, 2).contiguous(), context.transpose(1, 2).contiguous()
    taps7, taps1 = ck.taps_of(w7), ck.taps_of(w1)

    def kernel():
        full = ck.context_snake(context_cl, x_cl, alpha, EPS)
        h = ck.conv(full, taps7, b7, dilation, ck.Epilogue(alpha=alpha, eps=EPS))
        return ck.conv(h, taps1, b1, 1, ck.Epilogue(residual=x_cl))

    if PIECES:
        full = ck.context_snake(context_cl, x_cl, alpha, EPS)
        h = ck.conv(full, taps7, b7, dilation, ck.Epilogue(alpha=alpha, eps=EPS))
        pieces = {"context snake": lambda: ck.context_snake(context_cl, x_cl, alpha, EPS),
                  "conv": lambda: ck.conv(full, taps7, b7, dilation),
                  "conv + snake": lambda: ck.conv(full, taps7, b7, dilation, ck.Epilogue(alpha=alpha, eps=EPS)),
                  "1x1": lambda: ck.conv(h, taps1, b1, 1),
                  "1x1 + residual": lambda: ck.conv(h, taps1, b1, 1, ck.Epilogue(residual=x_cl))}
        print("   ", ", ".join(f"{name} {milliseconds(fn):.3f}" for name, fn in pieces.items()))
    return compare(engine, kernel)


def transposed(rows, length, c_in, c_out, stride):
    w, b, alpha = rand(c_in, c_out, 2 * stride, scale=c_in ** -0.5), rand(c_out, scale=0.1), \
        (torch.rand(c_in, device="cuda") + 0.5).to(DTYPE)
    x, carry = rand(rows, c_in, length), rand(rows, c_out, stride)

    def engine():  # codec_stream._ConvTranspose after the block's Snake
        y = F.conv_transpose1d(pointwise.snake(x, alpha[:, None], EPS), w, None, stride)
        y[..., :stride] += carry
        return y[..., :length * stride] + b[:, None]

    x_cl, taps, biases = x.transpose(1, 2).contiguous(), ck.transposed_as_taps(w), b.repeat(stride)
    context = rand(rows, 1, c_in)

    def kernel():
        full = ck.context_snake(context, x_cl, alpha, EPS)
        return ck.conv(full, taps, biases, 1).view(rows, length * stride, c_out)

    return compare(engine, kernel, exact=False)


def plain_conv(rows, length, c_in, c_out, snake_first, tanh):
    w, b = rand(c_out, c_in, 7, scale=c_in ** -0.5), rand(c_out, scale=0.1)
    alpha = (torch.rand(c_in, device="cuda") + 0.5).to(DTYPE)
    x, context = rand(rows, c_in, length), rand(rows, c_in, 6)

    def engine():
        full = pointwise.context_snake(context, x, alpha[:, None], EPS) if snake_first else torch.cat([context, x], -1)
        y = conv(full) + b[:, None]
        return torch.tanh(y) if tanh else y

    conv = best_conv(torch.cat([context, x], -1), w, 1)
    x_cl, context_cl, taps = x.transpose(1, 2).contiguous(), context.transpose(1, 2).contiguous(), ck.taps_of(w)

    def kernel():
        full = ck.context_snake(context_cl, x_cl, alpha, EPS) if snake_first else torch.cat([context_cl, x_cl], 1)
        return ck.conv(full, taps, b, 1, ck.Epilogue(tanh=tanh))

    return compare(engine, kernel)


def compare(engine, kernel, exact=True):
    with torch.inference_mode():
        reference, got = engine(), kernel()
        if exact:  # transposed outputs are compared in the tests, not here (carry vs context)
            got = got.transpose(1, 2)
            error = ((got.float() - reference.float()).abs().max() / reference.float().abs().max()).item()
        else:
            error = float("nan")
        return milliseconds(engine), milliseconds(kernel), error


def sweep(rows, length, c_in, c_out, taps, dilation):
    """ms of the bare convolution per tile setting, best first."""
    x = rand(rows, length + (taps - 1) * dilation, c_in)
    weight, bias = rand(taps * c_in, c_out, scale=0.05), rand(c_out)
    results = []
    for m, n, k, (warps, stages) in itertools.product((64, 128), (32, 64, 128, 256), (32, 64), ((4, 3), (8, 3), (4, 4))):
        if c_in % k or n > max(32, triton_next_pow2(c_out)):
            continue
        tiles = ck.Tiles(m, n, k, warps, stages)
        try:
            results.append((milliseconds(lambda: ck.conv(x, weight, bias, dilation, tiles=tiles)), tiles))
        except Exception as error:  # e.g. out of shared memory
            print(f"  {tiles}: {type(error).__name__}", file=sys.stderr)
    return sorted(results, key=lambda r: r[0])


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--frames", type=int, default=32)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--pieces", action="store_true", help="time each kernel of a residual unit too")
    p.add_argument("--large-tiles", action="store_true",
                   help="the kernel with the 64-row tiles at every size (conv_kernel.large_tiles)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    global PIECES
    PIECES = args.pieces
    if args.large_tiles:
        ck.tiles_for = lambda c_in, c_out, rows, length, element_size=2: ck.large_tiles(c_in, c_out, element_size)
    torch.backends.cuda.matmul.allow_tf32 = True
    rows, length = args.rows, args.frames * POSITIONS_PER_FRAME
    layers = [(f"conv in {LATENT}->{DIMS[0]}", lambda n=length: plain_conv(rows, n, LATENT, DIMS[0], False, False),
               (length, LATENT, DIMS[0], 7, 1))]
    for c_in, c_out, s in zip(DIMS, DIMS[1:], RATES):
        layers.append((f"transposed {c_in}->{c_out} s{s}", lambda a=(length, c_in, c_out, s): transposed(rows, *a),
                       (length, c_in, s * c_out, 2, 1)))
        length *= s
        for d in (1, 3, 9):
            layers.append((f"unit {c_out} d{d}", lambda a=(length, c_out, d): residual_unit(rows, *a),
                           (length, c_out, c_out, 7, d)))
    layers.append((f"conv out {DIMS[-1]}->1 + tanh", lambda n=length: plain_conv(rows, n, DIMS[-1], 1, True, True),
                   (length, DIMS[-1], 1, 7, 1)))
    report, totals = [], [0.0, 0.0]
    print(f"{rows} rows x {args.frames} frames, ms per call (CUDA graph), {torch.cuda.get_device_name()}")
    for name, run, shape in layers:
        engine_ms, kernel_ms, error = run()
        totals[0] += engine_ms
        totals[1] += kernel_ms
        entry = {"layer": name, "engine_ms": engine_ms, "kernel_ms": kernel_ms, "relative_error": error}
        line = f"{name:28s} engine {engine_ms:8.3f}  kernel {kernel_ms:8.3f}  error {error:.2e}"
        if args.sweep and (not name.startswith("unit") or name.endswith("d1")):
            timed = sweep(rows, *shape)
            if timed:
                entry["sweep"] = [{"ms": ms, "tiles": vars(t)} for ms, t in timed[:5]]
                default = [ms for ms, t in timed if t == ck.tiles_for(shape[1], shape[2], rows, shape[0])]
                line += f"  | conv alone: best {timed[0][0]:.3f} {timed[0][1]}, default {default[0] if default else float('nan'):.3f}"
            if name.startswith("unit"):  # and its 1x1 conv
                timed = sweep(rows, shape[0], shape[1], shape[2], 1, 1)
                entry["sweep_1x1"] = [{"ms": ms, "tiles": vars(t)} for ms, t in timed[:5]]
                line += f"  | 1x1: best {timed[0][0]:.3f} {timed[0][1]}"
        print(line, flush=True)
        report.append(entry)
        torch.cuda.empty_cache()
    print(f"{'total':28s} engine {totals[0]:8.3f}  kernel {totals[1]:8.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "frames": args.frames, "device": torch.cuda.get_device_name(),
                                         "layers": report, "engine_ms": totals[0], "kernel_ms": totals[1]}, indent=1))


if __name__ == "__main__":
    main()
