"""Which blocks and heads take the fused projection kernels (engine/model/fused_linear.py): the
choice itself needs no GPU."""

import types

import pytest
import torch

from engine.model import dual_ar
from engine.model.dual_ar import Block, RMSNorm, fused_norm_then_linear, norm_then_linear


def small_block(**kwargs):
    block = Block(32, 4, 2, 8, 64, 1e-6, True, **{"qkv_bias": False, "o_bias": False, **kwargs})
    block.feed_forward.fuse_gate_up()
    return block


def test_plain_weights_take_the_kernels_and_biased_or_unfused_ones_do_not(monkeypatch):
    monkeypatch.setattr(dual_ar, "projection_kernel", types.SimpleNamespace())  # as if Triton were there
    assert small_block().use_fused_projections()
    assert not small_block(qkv_bias=True).use_fused_projections()
    linear_layout = small_block()
    linear_layout.feed_forward.fuse_gate_up(as_linear=True)  # the layout quantization uses
    assert linear_layout.use_fused_projections()
    unfused = Block(32, 4, 2, 8, 64, 1e-6, True, False, False)  # w13 not built
    assert not unfused.use_fused_projections()
    monkeypatch.setattr(dual_ar, "projection_kernel", None)  # no Triton
    assert not small_block().use_fused_projections()


def test_the_model_gives_each_block_its_l2_hints(monkeypatch, s1_dir, s1_expected):
    """Slow blocks stream their weights, fast blocks keep wo and w2 (DualARTransformer.weight_cache_hints)."""
    from engine.model.dual_ar import TokenLayout
    from engine.model.loading import load_dual_ar

    monkeypatch.setattr(dual_ar, "projection_kernel", types.SimpleNamespace())
    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                         "cpu", torch.float32)
    model.fuse_()
    assert model.use_fused_projections()
    slow, fast = model.weight_cache_hints()
    assert [layer.weight_evictions for layer in model.layers] == [slow] * len(model.layers)
    assert [layer.weight_evictions for layer in model.fast_layers] == [fast] * len(model.fast_layers)
    assert slow == ("evict_first",) * 4 and fast == ("evict_first", "evict_last", "evict_first", "evict_last")


def test_int8_row_scaled_weights_take_the_kernels_and_int8_activations_do_not(monkeypatch):
    tq = pytest.importorskip("torchao.quantization")
    from engine import quantization

    monkeypatch.setattr(dual_ar, "projection_kernel", types.SimpleNamespace())
    block = small_block()
    block.feed_forward.fuse_gate_up(as_linear=True)
    tq.quantize_(block, quantization._config("int8"), filter_fn=quantization._linears_quantized_in("int8"))
    assert block.use_fused_projections()
    (wqkv, qkv_scale), (wo, wo_scale), (w13, w13_scale), _ = block._projection_operands
    assert qkv_scale is None and wqkv is block.attention.wqkv.weight  # kept in the model's dtype
    assert wo.dtype == torch.int8 and wo_scale.shape == (wo.shape[0],)
    assert w13.shape == (128, 32) and w13_scale.shape == (128,)  # gate rows, then up rows
    dequantized = block.attention.wo.weight.dequantize()
    torch.testing.assert_close(wo.float() * wo_scale[:, None].float(), dequantized.float())

    dynamic = small_block()  # int8 activations too: the kernel does not quantize them
    dynamic.feed_forward.fuse_gate_up(as_linear=True)
    tq.quantize_(dynamic, tq.Int8DynamicActivationInt8WeightConfig(version=2))
    assert not dynamic.use_fused_projections()


def test_the_fused_head_takes_the_plain_ops_off_the_gpu():
    torch.manual_seed(0)
    norm, weight, x = RMSNorm(32, 1e-6), torch.randn(10, 32), torch.randn(1, 1, 32)
    assert torch.equal(fused_norm_then_linear(norm, weight, x), norm_then_linear(norm, weight, x))
    calls = []

    def compiled_head(*args):  # the compiled step passes its compiled head here
        calls.append(args)
        return norm_then_linear(*args)

    assert torch.equal(fused_norm_then_linear(norm, weight, x, compiled_head), norm_then_linear(norm, weight, x))
    assert len(calls) == 1
