"""Which blocks and heads take the fused projection kernels (engine/model/fused_linear.py): the
choice itself needs no GPU."""

import types

import torch

from engine.model import dual_ar
from engine.model.dual_ar import Block, RMSNorm, fused_norm_then_linear, norm_then_linear


def small_block(**kwargs):
    block = Block(32, 4, 2, 8, 64, 1e-6, True, **{"qkv_bias": False, "o_bias": False, **kwargs})
    block.feed_forward.fuse_gate_up()
    return block


def test_plain_weights_take_the_kernels_and_quantized_biased_or_unfused_ones_do_not(monkeypatch):
    monkeypatch.setattr(dual_ar, "projection_kernel", types.SimpleNamespace())  # as if Triton were there
    assert small_block().use_fused_projections()
    assert not small_block(qkv_bias=True).use_fused_projections()
    linear_layout = small_block()
    linear_layout.feed_forward.fuse_gate_up(as_linear=True)  # the layout quantization uses
    assert not linear_layout.use_fused_projections()
    unfused = Block(32, 4, 2, 8, 64, 1e-6, True, False, False)  # w13 not built
    assert not unfused.use_fused_projections()
    monkeypatch.setattr(dual_ar, "projection_kernel", None)  # no Triton
    assert not small_block().use_fused_projections()


def test_the_fused_head_takes_the_plain_ops_off_the_gpu():
    torch.manual_seed(0)
    norm, weight, x = RMSNorm(32, 1e-6), torch.randn(10, 32), torch.randn(1, 1, 32)
    assert torch.equal(fused_norm_then_linear(norm, weight, x), norm_then_linear(norm, weight, x))
