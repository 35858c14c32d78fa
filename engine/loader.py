"""Assemble tokenizer, transformer and codec for an EngineConfig: real, demo or full-size random."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from loguru import logger

from .checkpoints import DEMO_DIR, resolve_checkpoint
from .config import EngineConfig
from .device import Placement, choose_placement
from .model.codec import ModdedDAC, load_codec, random_codec
from .model.codec_config import CodecConfig
from .model.dual_ar import DualARTransformer, TokenLayout
from .model.dual_ar_config import DualARConfig
from .model.loading import load_dual_ar, random_dual_ar
from .quantization import check_supported, load_quantized, quantize_codec, quantize_models, saved_quantization
from .text.tokenizer import S1Tokenizer

FULL_SIZE_CONFIG = Path(__file__).resolve().parent.parent / "assets" / "s1-mini-config.json"
DEMO_WEIGHT_STD = 0.2  # wide enough that the tiny random model's choices are peaked, not uniform
DEMO_END_BOOST = 5.0  # scales the <|im_end|> output row so that the demo model stops on its own, mostly early


@dataclass
class LoadedModels:
    tokenizer: S1Tokenizer
    model: DualARTransformer
    codec: ModdedDAC
    placement: Placement
    description: str
    fingerprint: str  # names the codec weights, so cached reference codes never cross models
    random_weights: bool  # output is noise (demo or full-size random)


def token_layout(tokenizer: S1Tokenizer, codec_config: CodecConfig) -> TokenLayout:
    return TokenLayout(tokenizer.semantic_begin_id, tokenizer.semantic_end_id, tokenizer.im_end_id,
                       codec_config.residual_codebook_size)


def load_models(config: EngineConfig) -> LoadedModels:
    placement = choose_placement(config.device, config.precision)
    check_supported(config.quantize, placement)  # before minutes of loading
    if config.demo:
        models = _random_models(placement, DEMO_DIR / "config.json", CodecConfig.from_json(DEMO_DIR / "codec_config.json"),
                                DEMO_WEIGHT_STD, DEMO_END_BOOST, "DEMO: tiny random-weight model (produces noise, not speech)",
                                config.quantize)
    elif config.random_weights:
        models = _random_models(placement, FULL_SIZE_CONFIG, CodecConfig.s1_mini(), None, 1.0,
                                "full-size S1-mini architecture with RANDOM weights (for benchmarks; produces noise)",
                                config.quantize)
    else:
        models = _checkpoint_models(resolve_checkpoint(config.checkpoint), placement, config.quantize)
    if config.quantize != "none":
        # The codec's encoder is quantized too, so its reference codes must not mix with the exact codec's.
        models.fingerprint += f":{config.quantize}"
        models.description += f", {config.quantize} weights"
        logger.info("quantized: transformer blocks {}, codec transformers int8", config.quantize)
    return models


def _checkpoint_models(directory: Path, placement: Placement, quantize: str) -> LoadedModels:
    tokenizer = S1Tokenizer.from_dir(directory)
    codec = _place_codec(load_codec(directory / "codec.pth", device=placement.device), placement)
    layout = token_layout(tokenizer, codec.config)
    if saved_quantization(directory) is not None:
        model = load_quantized(directory, layout, quantize, placement)
        quantize_codec(codec, quantize)
    else:
        model = load_dual_ar(directory, layout, placement.device, placement.dtype).fuse_()
        quantize_models(model, codec, quantize, placement)
    logger.info("loaded checkpoint from {}", directory)
    return LoadedModels(tokenizer, model, codec, placement, f"OpenAudio S1-mini from {directory}",
                        _file_fingerprint(directory / "codec.pth"), random_weights=False)


def _random_models(placement: Placement, llm_config_path: Path, codec_config: CodecConfig, std: float | None,
                   end_boost: float, description: str, quantize: str) -> LoadedModels:
    tokenizer = S1Tokenizer.from_dir(DEMO_DIR)
    llm_config = DualARConfig.from_json(llm_config_path)
    if std is not None:
        llm_config = DualARConfig(**{**llm_config.__dict__, "initializer_range": std})
    started = time.perf_counter()
    codec = _place_codec(random_codec(codec_config, seed=0, device=placement.device), placement)
    codec_done = time.perf_counter()
    model = random_dual_ar(llm_config, token_layout(tokenizer, codec_config), placement.device, placement.dtype).fuse_()
    logger.debug("random weights: codec {:.1f} s, transformer {:.1f} s", codec_done - started,
                 time.perf_counter() - codec_done)
    if end_boost != 1.0:
        model.output.weight[tokenizer.im_end_id] *= end_boost
    quantize_models(model, codec, quantize, placement)
    logger.warning("{}", description)
    fingerprint = "random:" + hashlib.sha256(repr((llm_config, codec_config)).encode()).hexdigest()[:16]
    return LoadedModels(tokenizer, model, codec, placement, description, fingerprint, random_weights=True)


def _place_codec(codec: ModdedDAC, placement: Placement) -> ModdedDAC:
    """On GPUs the decode path runs in the engine's half precision (as the reference's bf16 autocast
    does); encoding reference clips stays in fp32 like the reference."""
    if placement.device.type == "cuda" and placement.dtype != torch.float32:
        codec.decode_in(placement.dtype)
    return codec


def _file_fingerprint(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
