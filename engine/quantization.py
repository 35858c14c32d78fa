"""Quantized weights with torchao, and pre-quantized checkpoint directories.

Modes (EngineConfig.quantize):
- int8: int8 weights with one scale per output row (any device; the matmul runs in the activation
  dtype, so the gain is memory, and speed only in the compiled batch-1 step, whose fused projection
  kernels read the int8 weights as they are).
- int4: int4 weights in groups of 32 (HQQ scales), tile-packed for tinygemm: CUDA compute
  capability >= 8.0, bf16.
- fp8: fp8 (e4m3) weights and activations with per-row scales on fp8 tensor cores: CUDA compute
  capability >= 8.9, bf16.

What is quantized: the Linear layers of the slow and fast transformer blocks (attention and the
fused gate/up and down projections), which are nearly all the weights read per decoded frame; in
int8 mode the attention's QKV projection stays in the model's dtype (`_INT8_KEEPS`). The
heads stay as they are: the runtime slices them (SemanticHead reads 4097 rows of `output`,
forward_fast the leading rows of `fast_output`), they read little per frame, and the logits are
what sampling sees. The token embedding table (155,776 x 1024, 319 MB in bf16, the largest tensor
left) goes int8 with one scale per row in every mode (`Int8RowEmbedding`: a lookup dequantizes only
the rows it reads; torchao's quantized embedding would dequantize the whole table on every call);
the small codebook embeddings stay. The codec's transformers (encoder, pre_module, post_module) go
int8 in every mode; its convolutions stay as they are.

A pre-quantized checkpoint (scripts/quantize.py) is a checkpoint directory whose model.pth holds the
quantized state dict, with quantization.json naming how it was made; the loader uses it as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from loguru import logger

from .device import Placement
from .errors import CheckpointError, DeviceError, InputError
from .model.codec import ModdedDAC
from .model.codec_transformer import WindowLimitedTransformer
from .model.dual_ar import DualARTransformer, TokenLayout
from .model.dual_ar_config import DualARConfig
from .model.loading import check_state_matches, read_state_dict

INFO_FILE = "quantization.json"
# (compute capability, what needs it) per GPU-only mode.
_GPU_NEEDS = {"int4": ((8, 0), "the tile-packed int4 kernel (tinygemm)"),
              "fp8": ((8, 9), "fp8 tensor cores")}


def check_supported(mode: str, placement: Placement) -> None:
    """DeviceError unless `mode` can run on this device and precision with the torchao installed."""
    if mode == "none":
        return
    if mode in _GPU_NEEDS:
        (major, minor), needs = _GPU_NEEDS[mode]
        device = placement.device
        if device.type != "cuda":
            raise DeviceError(f"--quantize {mode} is unavailable on {device.type}: it needs {needs}, on an NVIDIA "
                              f"GPU of compute capability {major}.{minor} or newer. Use --quantize int8, which runs "
                              "on any device")
        capability = torch.cuda.get_device_capability(device)
        if capability < (major, minor):
            alternatives = "int4 or int8" if mode == "fp8" and capability >= _GPU_NEEDS["int4"][0] else "int8"
            raise DeviceError(f"--quantize {mode} needs {needs}, on compute capability {major}.{minor} or newer; "
                              f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}. "
                              f"Use --quantize {alternatives}")
        if placement.dtype != torch.bfloat16:
            raise DeviceError(f"--quantize {mode} runs in bf16 only; start with --precision bf16 (or auto)")
    _torchao()


def quantize_models(model: DualARTransformer, codec: ModdedDAC, mode: str, placement: Placement) -> None:
    """Quantize the transformer blocks in `mode` and the codec's transformers in int8, in place."""
    check_supported(mode, placement)
    quantize_transformer(model, mode)
    quantize_codec(codec, mode)


def quantize_transformer(model: DualARTransformer, mode: str) -> None:
    if mode == "none":
        return
    # Gate and up as one Linear: one quantized matrix and one matmul. Every mode's scales are per
    # row (or per group within a row), so this gives the values of quantizing w1 and w3 apart.
    model.fuse_(as_linear=True)
    quantize_, config = _torchao().quantize_, _config(mode)
    for blocks in (model.layers, model.fast_layers):
        quantize_(blocks, config, filter_fn=_linears_quantized_in(mode))
    model.embeddings = Int8RowEmbedding.quantize(model.embeddings)


# int8 keeps the QKV projection in the model's dtype: its per-row scale would sit between the matmul
# and the qk-norm, RoPE and KV write of a one-row step, which Inductor then splits into six kernels
# per layer instead of three, costing more than the int8 matmul saves. It is a quarter of a
# block's weights (+125 MB over all-int8 at full size). The fused batch-1 projections
# (model/fused_linear.py) apply the scale inside their kernel, where an int8 QKV may pay off.
_INT8_KEEPS = ("attention.wqkv",)


def _linears_quantized_in(mode: str):
    kept = _INT8_KEEPS if mode == "int8" else ()
    return lambda module, name: isinstance(module, torch.nn.Linear) and not name.endswith(kept)


def int8_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (R, D) as int8 with one fp32 scale per row (absmax / 127): (int8 (R, D), scale (R, 1))."""
    rows = rows.float()
    scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
    return torch.round(rows / scale).clamp(-127, 127).to(torch.int8), scale


class Int8RowEmbedding(torch.nn.Module):
    """An embedding table in int8 with one scale per row (absmax / 127); a lookup dequantizes only
    the rows it reads."""

    QUANTIZE_ROWS = 16384  # rows converted at a time: no fp32 copy of the whole table

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)  # (V, D) int8
        self.scale = torch.nn.Parameter(scale, requires_grad=False)  # (V, 1) in the model's dtype

    @classmethod
    def quantize(cls, embedding: torch.nn.Embedding) -> "Int8RowEmbedding":
        table = embedding.weight
        weight = torch.empty(table.shape, dtype=torch.int8, device=table.device)
        scale = torch.empty(table.shape[0], 1, dtype=table.dtype, device=table.device)
        for start in range(0, table.shape[0], cls.QUANTIZE_ROWS):
            rows, row_scale = int8_rows(table[start:start + cls.QUANTIZE_ROWS])
            weight[start:start + cls.QUANTIZE_ROWS] = rows
            scale[start:start + cls.QUANTIZE_ROWS] = row_scale.to(table.dtype)
        return cls(weight, scale)

    @classmethod
    def empty_like(cls, embedding: torch.nn.Embedding) -> "Int8RowEmbedding":
        """Storage to load a saved table into (on the meta device while a model is assembled)."""
        table = embedding.weight
        return cls(torch.empty(table.shape, dtype=torch.int8, device=table.device),
                   torch.empty(table.shape[0], 1, dtype=table.dtype, device=table.device))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids] * self.scale[ids]  # int8 x scale promotes to the scale's dtype: no cast kernel


def quantize_codec(codec: ModdedDAC, mode: str) -> None:
    if mode == "none":
        return
    quantize_, config = _torchao().quantize_, _config("int8")
    for module in [m for m in codec.modules() if isinstance(m, WindowLimitedTransformer)]:
        quantize_(module, config)


def _config(mode: str):
    tq = _torchao()
    # set_inductor_config=False: torchao would otherwise change the global Inductor settings of every
    # later compile (and, in 0.17, fp32 matmul precision); engine/compilation.py decides those.
    if mode == "int8":
        # version 2 (Int8Tensor): torchao 0.17 still defaults to the deprecated version 1.
        return tq.Int8WeightOnlyConfig(granularity=tq.PerRow(), version=2, set_inductor_config=False)
    if mode == "int4":
        # group 32 with HQQ scales: the most accurate tile-packed setting (torchao's README); a small
        # model loses more to int4 than a large one.
        return tq.Int4WeightOnlyConfig(group_size=32, int4_packing_format="tile_packed_to_4d",
                                       int4_choose_qparams_algorithm="hqq", set_inductor_config=False)
    return tq.Float8DynamicActivationFloat8WeightConfig(granularity=tq.PerRow(), set_inductor_config=False)


def _torchao():
    """torchao.quantization; importing it also lets torch.load(weights_only=True) read its tensors."""
    try:
        import torchao.quantization
    except ImportError:
        raise DeviceError("--quantize needs torchao, which is not installed: pip install torchao "
                          "(0.17 or newer), or start with --quantize none") from None
    return torchao.quantization


def _torchao_version() -> str:
    import torchao

    return torchao.__version__


# ---- pre-quantized checkpoints --------------------------------------------------------------------


def device_kind(device: torch.device) -> str:
    """What a packed layout depends on: the device type, and for GPUs the vendor's toolkit."""
    if device.type == "cuda":
        return "rocm" if torch.version.hip else "cuda"
    return device.type


def save_quantized(model: DualARTransformer, directory: Path, mode: str, placement: Placement) -> None:
    """Write model.pth (the quantized state dict) and quantization.json into `directory`."""
    torch.save(model.state_dict(), directory / "model.pth")
    device = placement.device
    info = {
        "mode": mode,
        "precision": placement.precision,
        "device_kind": device_kind(device),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "torch": torch.__version__,
        "torchao": _torchao_version(),
        "kept_in_model_dtype": list(_INT8_KEEPS) if mode == "int8" else [],
    }
    (directory / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def saved_quantization(directory: Path) -> dict | None:
    """quantization.json of a pre-quantized checkpoint, None for a plain one."""
    path = directory / INFO_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); quantize the checkpoint again") from None


def load_quantized(directory: Path, layout: TokenLayout, mode: str, placement: Placement) -> DualARTransformer:
    """The transformer of a pre-quantized checkpoint, checked against the mode, device and precision."""
    info = saved_quantization(directory)
    saved = info.get("mode")
    if mode != saved:
        raise InputError(f"{directory} is pre-quantized to {saved}, so it runs only with --quantize {saved} (not "
                         f"{mode}); for another mode, point --checkpoint at the original checkpoint")
    check_supported(mode, placement)
    if mode == "int4" and info.get("device_kind") != device_kind(placement.device):
        raise CheckpointError(f"{directory} holds int4 weights packed for {info.get('device_kind')} "
                              f"({info.get('device')}); they cannot run on {device_kind(placement.device)}. "
                              "Quantize the original checkpoint again on this machine (scripts/quantize.py)")
    if info.get("precision") != placement.precision:
        raise InputError(f"{directory} was quantized for {info.get('precision')}; start with "
                         f"--precision {info.get('precision')}")

    with torch.device("meta"):
        model = DualARTransformer(DualARConfig.from_json(directory / "config.json"), layout).fuse_(as_linear=True)
    try:
        state = read_state_dict(directory / "model.pth")
    except CheckpointError as exc:
        installed = _torchao_version()
        if info.get("torchao") == installed:
            raise
        raise CheckpointError(f"{exc}. Its tensors were saved by torchao {info.get('torchao')} and this is torchao "
                              f"{installed}: quantize again here, or install torchao=={info.get('torchao')}") from None
    if mode == "int8" and "kept_in_model_dtype" not in info:
        logger.warning("{} was quantized before int8 kept the QKV projections in {}; it runs, a little slower "
                       "at one stream than a checkpoint quantized again with scripts/quantize.py", directory,
                       placement.precision)
    if "embeddings.scale" in state:  # checkpoints saved before the table was quantized have none
        model.embeddings = Int8RowEmbedding.empty_like(model.embeddings)
    check_state_matches(model, state, str(directory / "model.pth"))
    model.load_state_dict({k: v.to(placement.device) for k, v in state.items()}, strict=True, assign=True)
    model.reset_buffers(placement.device)
    return model.eval().requires_grad_(False)

