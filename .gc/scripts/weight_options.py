"""The --weights and --checkpoint options that the benchmark and profiling scripts share."""

from __future__ import annotations

import argparse


def add_weight_options(parser: argparse.ArgumentParser, *, demo: bool = False) -> None:
    kinds = ["random", "real", *(["demo"] if demo else [])]
    parser.add_argument(
        "--weights", choices=kinds,
        help="random: full-size random weights, no checkpoint needed (the default without --checkpoint); "
             "real: the checkpoint of --checkpoint, or the default one"
             + ("; demo: the tiny demo model (checks the script itself, not a benchmark)" if demo else ""))
    parser.add_argument("--checkpoint", help="checkpoint dir or Hugging Face repo id (implies --weights real)")


def parse_with_weights(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """parse_args, then settle --weights: --checkpoint alone means the real weights, and a
    checkpoint beside --weights random or demo is refused rather than silently not loaded."""
    return settle_weights(parser, parser.parse_args(argv))


def settle_weights(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The settling step of parse_with_weights, for scripts that load weights only in some modes."""
    if args.weights is None:
        args.weights = "real" if args.checkpoint else "random"
    elif args.checkpoint and args.weights != "real":
        parser.error(f"--checkpoint loads real weights; drop it or --weights {args.weights}")
    return args


def weight_config(weights: str, checkpoint: str | None) -> dict:
    """EngineConfig fields for the chosen weights (the settled --weights, and --checkpoint)."""
    return {"random_weights": weights == "random", "demo": weights == "demo", "checkpoint": checkpoint}
