"""The decode step's Triton attention kernel against PyTorch's attention (CUDA with Triton only)."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
attention_kernel = pytest.importorskip("engine.model.decode_attention", reason="needs Triton")


def ragged_case(batch, kv_len, dtype, capacity=4096, kv_heads=8, group=2, head_dim=128, seed=0):
    """q and strided (B, H_kv, kv_len, D) views of a larger cache, lengths from 1 to kv_len."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, kv_heads, group, head_dim, device="cuda", generator=gen).to(dtype)
    cache_k, cache_v = (torch.randn(batch, kv_heads, capacity, head_dim, device="cuda", generator=gen).to(dtype)
                        for _ in range(2))
    lengths = torch.randint(1, kv_len + 1, (batch,), device="cuda", generator=gen)
    if batch > 1:
        lengths[0], lengths[-1] = 1, kv_len
    return q, cache_k[:, :, :kv_len], cache_v[:, :, :kv_len], lengths


def sdpa_reference(q, keys, values, lengths):
    mask = torch.arange(keys.shape[2], device="cuda") < lengths[:, None, None, None]
    return torch.nn.functional.scaled_dot_product_attention(
        q.float(), keys.float(), values.float(), attn_mask=mask.expand(-1, 1, q.shape[2], -1))


@pytest.mark.parametrize("batch, kv_len", [(1, 256), (1, 1024), (5, 300), (64, 1024)])
def test_fp32_equals_sdpa_over_each_rows_live_keys(batch, kv_len):
    q, keys, values, lengths = ragged_case(batch, kv_len, torch.float32)
    out = attention_kernel.decode_attention(q, keys, values, lengths)
    torch.testing.assert_close(out, sdpa_reference(q, keys, values, lengths), rtol=1e-5, atol=1e-5)


def test_bf16_is_as_close_to_fp32_as_the_written_out_attention():
    """bf16 inputs: the kernel's error against an fp32 reference is of the size the PyTorch-ops
    attention of the compiled step (dual_ar.one_query_attention) makes."""
    from engine.model.dual_ar import one_query_attention

    q, keys, values, lengths = ragged_case(16, 512, torch.bfloat16)
    reference = sdpa_reference(q, keys, values, lengths)
    mask = (torch.arange(512, device="cuda") < lengths[:, None, None, None]).expand(-1, 1, 2, -1)
    ops_error = (one_query_attention(q, keys, values, mask).float() - reference).abs().max()
    kernel = attention_kernel.decode_attention(q, keys, values, lengths)
    assert kernel.dtype == torch.bfloat16
    assert (kernel.float() - reference).abs().max() <= 2 * ops_error


def test_lengths_past_the_bucket_attend_the_whole_bucket():
    q, keys, values, lengths = ragged_case(4, 384, torch.float32)
    expected = attention_kernel.decode_attention(q, keys, values, torch.full_like(lengths, 384))
    assert torch.equal(attention_kernel.decode_attention(q, keys, values, torch.full_like(lengths, 4096)), expected)


def test_keys_past_a_rows_length_are_never_read():
    """NaNs past every row's length change nothing: those keys and values are not touched."""
    q, keys, values, lengths = ragged_case(8, 512, torch.bfloat16)
    expected = attention_kernel.decode_attention(q, keys, values, lengths)
    past = torch.arange(512, device="cuda")[None, None, :, None] >= lengths[:, None, None, None]
    poisoned = [t.masked_fill(past, float("nan")) for t in (keys, values)]
    assert torch.equal(attention_kernel.decode_attention(q, *poisoned, lengths), expected)


def test_compiles_into_a_cuda_graph():
    q, keys, values, lengths = ragged_case(4, 512, torch.bfloat16)
    expected = attention_kernel.decode_attention(q, keys, values, lengths)
    compiled = torch.compile(attention_kernel.decode_attention, fullgraph=True, dynamic=True)
    compiled(q, keys, values, lengths)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(q, keys, values, lengths)
    lengths.fill_(512)  # a replay reads the lengths as they are then
    graph.replay()
    torch.testing.assert_close(out, attention_kernel.decode_attention(q, keys, values, lengths))
    assert not torch.equal(out, expected)
