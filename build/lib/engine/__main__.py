"""Command line: `python -m engine synth ...` and `python -m engine tokenize ...`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import S1Error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description="OpenAudio S1-mini engine tools")
    commands = parser.add_subparsers(dest="command", required=True)

    synth = commands.add_parser("synth", help="speak a text into a WAV file")
    synth.add_argument("--text", required=True, help="the text to speak")
    synth.add_argument("--out", required=True, type=Path, help="output .wav path")
    synth.add_argument("--reference", type=Path, help="reference audio file to clone the voice from")
    synth.add_argument("--reference-text", help="exact transcript of --reference")
    synth.add_argument("--voice", help="id of a saved voice (see the app's Voice tab)")
    synth.add_argument("--checkpoint", help="checkpoint directory or Hugging Face repo id "
                                            "(default: ./checkpoints/openaudio-s1-mini, else fishaudio/openaudio-s1-mini)")
    synth.add_argument("--demo", action="store_true", help="tiny random model: no checkpoint needed, produces noise")
    synth.add_argument("--random-weights", action="store_true", help="full-size model with random weights (benchmarks)")
    synth.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    synth.add_argument("--precision", help="auto, bf16, fp16 or fp32 (default auto)")
    synth.add_argument("--seed", type=int, help="seed for reproducible sampling")
    synth.add_argument("--temperature", type=float)
    synth.add_argument("--top-p", type=float)
    synth.add_argument("--repetition-penalty", type=float)
    synth.add_argument("--max-new-tokens", type=int, help="frames per text chunk at most (0 = until the context is full)")
    synth.add_argument("--chunk-length", type=int, help="characters of text per generated chunk")

    tokenize = commands.add_parser("tokenize", help="print each text's token ids as a JSON list on its own line")
    tokenize.add_argument("--checkpoint", required=True, type=Path,
                          help="directory holding tokenizer.tiktoken and special_tokens.json")
    tokenize.add_argument("texts", nargs="+")

    args = parser.parse_args(argv)
    try:
        return _synth(args) if args.command == "synth" else _tokenize(args)
    except S1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _tokenize(args) -> int:
    from .text.tokenizer import S1Tokenizer

    tokenizer = S1Tokenizer.from_dir(args.checkpoint)
    for text in args.texts:
        print(json.dumps(tokenizer.encode(text)))
    return 0


def _synth(args) -> int:
    import soundfile as sf

    from .config import EngineConfig
    from .errors import InputError
    from .facade import ReferenceInput, TTSEngine
    from .params import SamplingParams

    if (args.reference is None) != (args.reference_text is None):
        raise InputError("--reference and --reference-text go together: give the clip and the words spoken in it")
    sampling = {k: v for k, v in {
        "temperature": args.temperature, "top_p": args.top_p, "repetition_penalty": args.repetition_penalty,
        "max_new_tokens": args.max_new_tokens, "chunk_length": args.chunk_length, "seed": args.seed,
    }.items() if v is not None}
    params = SamplingParams(**sampling)
    config = EngineConfig.from_env(checkpoint=args.checkpoint, demo=args.demo or None,
                                   random_weights=args.random_weights or None, device=args.device,
                                   precision=args.precision, seed=args.seed)
    engine = TTSEngine.from_config(config)
    try:
        references = [ReferenceInput(args.reference, args.reference_text)] if args.reference else []
        result = engine.synthesize(args.text, references=references, voice=args.voice, params=params)
    finally:
        engine.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(args.out, result.audio, result.sample_rate, subtype="PCM_16")
    s = result.stats
    print(f"wrote {args.out}: {s['audio_s']:.2f} s of audio, {s['frames']} frames in {s['total_s']:.2f} s "
          f"(real-time factor {s['rtf']:.3f}, seed {s['seed']})" if s["audio_s"] else f"wrote {args.out}: no audio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
