#!/usr/bin/env python
"""Pre-quantize S1-mini: write a checkpoint directory whose transformer weights are already quantized,
so that the engine loads them as they are instead of quantizing at every start.

    python scripts/quantize.py --mode int8 --output checkpoints/s1-mini-int8
    python scripts/quantize.py --mode int4 --checkpoint fishaudio/openaudio-s1-mini --output checkpoints/s1-mini-int4
    python launch.py --checkpoint checkpoints/s1-mini-int8 --quantize int8

Run it on the kind of machine that will serve: int4 and fp8 quantize on the GPU, int4's packed layout
belongs to the GPU kind it was made on, and the precision is recorded and must match at load. The
output holds model.pth (the quantized state dict), quantization.json (mode, precision, device, torch
and torchao versions) and the checkpoint's other files as they are: the codec's transformers are
quantized again at load (int8, a fraction of a second). --demo and --random-weights quantize the
random test models, for trying the workflow without the real weights.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from engine.config import PRECISIONS, QUANTIZE_MODES, EngineConfig
    from engine.errors import S1Error

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", metavar="PATH_OR_REPO",
                        help="checkpoint directory or Hugging Face repo id (default: as launch.py)")
    source.add_argument("--demo", action="store_true", help="the tiny random-weight model")
    source.add_argument("--random-weights", action="store_true", help="the full-size model with random weights")
    p.add_argument("--mode", required=True, choices=[m for m in QUANTIZE_MODES if m != "none"])
    p.add_argument("--output", required=True, type=Path, help="directory to write (created if needed)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto: the GPU if any)")
    p.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="as the engine will run it (default auto: bf16 on GPUs that have it, fp32 on CPU)")
    args = p.parse_args(argv)
    config = EngineConfig(checkpoint=args.checkpoint, demo=args.demo, random_weights=args.random_weights,
                          device=args.device, precision=args.precision, quantize=args.mode)
    try:
        write_quantized_checkpoint(config, args.output)
    except S1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}; run it with: python launch.py --checkpoint {args.output} --quantize {args.mode}")
    return 0


def write_quantized_checkpoint(config, output: Path) -> None:
    import torch

    from engine.checkpoints import DEMO_DIR, OPTIONAL_FILES, REQUIRED_FILES, resolve_checkpoint
    from engine.errors import InputError
    from engine.loader import FULL_SIZE_CONFIG, load_models
    from engine.model.codec import random_codec
    from engine.quantization import save_quantized, saved_quantization

    source = None if config.demo or config.random_weights else resolve_checkpoint(config.checkpoint)
    if source is not None:
        if output.resolve() == source.resolve():
            raise InputError("--output is the checkpoint itself: writing there would replace its model.pth")
        if saved_quantization(source) is not None:
            raise InputError(f"{source} is pre-quantized already; quantize the original checkpoint")
    models = load_models(config)
    output.mkdir(parents=True, exist_ok=True)
    if source is not None:
        for name in [n for n in REQUIRED_FILES + OPTIONAL_FILES if n != "model.pth"]:
            if (source / name).is_file():
                shutil.copy(source / name, output / name)
    else:
        shutil.copy(DEMO_DIR / "config.json" if config.demo else FULL_SIZE_CONFIG, output / "config.json")
        for name in ("tokenizer.tiktoken", "special_tokens.json"):
            shutil.copy(DEMO_DIR / name, output / name)
        # The loader's random codec (same seed and device), in the checkpoint layout that codec.pth has.
        codec_config = models.codec.config
        codec = random_codec(codec_config, seed=0, device=models.placement.device, for_inference=False)
        torch.save(codec.state_dict(), output / "codec.pth")
        (output / "codec_config.json").write_text(json.dumps(codec_config.to_dict(), indent=2) + "\n", encoding="utf-8")
    save_quantized(models.model, output, config.quantize, models.placement)


if __name__ == "__main__":
    sys.exit(main())
