"""The batch-1 step's attention over a short cache inside its output projection (attention_output)
against the plain path: Attention.attend, then wo and the residual (CUDA with Triton only)."""

import pytest
import torch
import torch.nn.functional as F

from engine.model.dual_ar import Attention, KVView, rope_table

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
kernel_module = pytest.importorskip("engine.model.attention_output", reason="needs Triton")

HEADS, KV_HEADS, HEAD_DIM, CAPACITY, DIM = 16, 8, 64, 10, 1024  # S1-mini's fast transformer


def case(position, dtype, qk_norm=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=gen) * scale

    attn = Attention(DIM, HEADS, KV_HEADS, HEAD_DIM, 1e-6, qk_norm, False, False).cuda().requires_grad_(False)
    if qk_norm:
        attn.q_norm.weight.data = 1 + 0.1 * randn(HEAD_DIM)
        attn.k_norm.weight.data = 1 + 0.1 * randn(HEAD_DIM)
    attn.wo.weight.data = randn(DIM, HEADS * HEAD_DIM, scale=(HEADS * HEAD_DIM) ** -0.5)
    attn = attn.to(dtype)
    qkv = randn(1, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype)
    k_cache, v_cache = (randn(1, KV_HEADS, CAPACITY, HEAD_DIM).to(dtype) for _ in range(2))
    residual = randn(1, DIM).to(dtype)
    positions = torch.tensor([position], device="cuda")
    rope = rope_table(CAPACITY, HEAD_DIM, 1e6).cuda()[positions][:, None]
    return attn, qkv, rope, k_cache, v_cache, positions, residual


def plain(attn, qkv, rope, k_cache, v_cache, positions, residual):
    """Attention.attend (SDPA), wo and the residual, on copies of the caches: (out, k_cache, v_cache)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    keys = torch.arange(int(positions) + 1, device="cuda")
    attended = attn.attend(qkv[:, None], rope, KVView(k_cache, v_cache, positions[:, None], keys, None))[:, 0]
    return residual + F.linear(attended, attn.wo.weight), k_cache, v_cache


def fused(attn, qkv, rope, k_cache, v_cache, positions, residual, n_keys=None):
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    out = kernel_module.attention_output(qkv, *attn.kernel_norms(), rope.reshape(1, -1), k_cache, v_cache, positions,
                                         int(positions) + 1 if n_keys is None else n_keys, HEADS, attn.wo.weight,
                                         None, residual)
    return out, k_cache, v_cache


@pytest.mark.parametrize("position", [0, 1, 5, 9])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_fp32_equals_the_plain_path(position, qk_norm):
    operands = case(position, torch.float32, qk_norm)
    for got, expected in zip(fused(*operands), plain(*operands), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", [0, 9])
def test_bf16_is_as_close_to_fp32_as_the_plain_bf16_path(position):
    attn, *tensors = case(position, torch.bfloat16)
    reference = plain(attn.float(), *(t if t.dtype == torch.int64 else t.float() for t in tensors))
    attn = attn.to(torch.bfloat16)  # Module.float() converted it in place
    ops = plain(attn, *tensors)
    got = fused(attn, *tensors)
    assert got[0].dtype == torch.bfloat16
    for name, g, o, r in zip(("out", "keys", "values"), got, ops, reference, strict=True):
        assert (g.float() - r).abs().max() <= 2 * (o.float() - r).abs().max() + 1e-6, name


def test_only_the_new_position_is_written_and_later_keys_are_never_read():
    attn, qkv, rope, k_cache, v_cache, positions, residual = case(4, torch.float32)
    expected, k_expected, v_expected = fused(attn, qkv, rope, k_cache, v_cache, positions, residual)
    later = torch.arange(CAPACITY, device="cuda")[None, None, :, None] > 4
    poisoned = [t.masked_fill(later, float("nan")) for t in (k_cache, v_cache)]
    out, k_new, v_new = fused(attn, qkv, rope, *poisoned, positions, residual, n_keys=CAPACITY)
    assert torch.equal(out, expected)
    at_new = torch.arange(CAPACITY, device="cuda") == 4
    for new, old, fresh in ((k_new, k_cache, k_expected), (v_new, v_cache, v_expected)):
        assert torch.equal(new[:, :, at_new], fresh[:, :, at_new]) and not torch.equal(new[:, :, at_new], old[:, :, at_new])
        assert torch.equal(new[:, :, :4], old[:, :, :4])


def test_supports_short_caches_and_power_of_two_heads_only():
    assert kernel_module.supports(16, 64, 10)
    assert not kernel_module.supports(16, 64, 64)  # more keys than a program holds
    assert not kernel_module.supports(12, 64, 10) and not kernel_module.supports(16, 48, 10)
