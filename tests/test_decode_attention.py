"""The decode step's attention kernel (norms, RoPE, KV write and attention of one new token) against
Attention.attend's plain path (CUDA with Triton only)."""

import pytest
import torch

from engine.model.dual_ar import Attention, KVView, rope_table

pytestmark = pytest.mark.gpu
attention_kernel = None  # engine.model.decode_attention, imported once a test runs: it needs Triton, which a CPU machine may lack


@pytest.fixture(scope="module", autouse=True)
def triton_module():
    global attention_kernel
    attention_kernel = pytest.importorskip("engine.model.decode_attention", reason="needs Triton")

SLOW = dict(n_heads=16, kv_heads=8, head_dim=128, qk_norm=True, capacity=4096)  # S1-mini's layers
FAST = dict(n_heads=16, kv_heads=8, head_dim=64, qk_norm=False, capacity=10)


def attention_case(batch, n_keys, dtype, n_heads, kv_heads, head_dim, qk_norm, capacity, positions=None, seed=0):
    """An Attention module (only its norms matter), one projected token per row, caches, positions."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    attn = Attention(n_heads * head_dim, n_heads, kv_heads, head_dim, 1e-6, qk_norm, False, False).cuda()
    attn.requires_grad_(False)  # as in the engine: no autograd through the kernel
    if qk_norm:
        attn.q_norm.weight.data = 1 + 0.1 * randn(head_dim)
        attn.k_norm.weight.data = 1 + 0.1 * randn(head_dim)
    attn = attn.to(dtype)
    qkv = randn(batch, (n_heads + 2 * kv_heads) * head_dim).to(dtype)
    k_cache, v_cache = (randn(batch, kv_heads, capacity, head_dim).to(dtype) for _ in range(2))
    if positions is None:
        positions = torch.randint(0, n_keys, (batch,), device="cuda", generator=gen)
        positions[-1] = n_keys - 1
    rope = rope_table(capacity, head_dim, 1e6).cuda()[positions][:, None]
    return attn, qkv, rope, k_cache, v_cache, positions


def plain(attn, qkv, rope, k_cache, v_cache, positions, n_keys):
    """Attention.attend outside compilation (SDPA), on copies of the caches: (out, k_cache, v_cache)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    keys = torch.arange(n_keys, device="cuda")
    kv = KVView(k_cache, v_cache, positions[:, None], keys, keys <= positions[:, None, None, None])
    return attn.attend(qkv[:, None], rope, kv)[:, 0], k_cache, v_cache


def kernel(attn, qkv, rope, k_cache, v_cache, positions, n_keys):
    """The kernel on copies of the caches: (out, k_cache, v_cache)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    out = attention_kernel.decode_attention(qkv, *attn.kernel_norms(), rope.reshape(qkv.shape[0], -1), k_cache, v_cache,
                                            positions, n_keys, attn.n_head)
    return out, k_cache, v_cache


@pytest.mark.parametrize("batch, n_keys, shape", [(1, 512, SLOW), (1, 1024, SLOW), (1, 300, SLOW), (5, 300, SLOW),
                                                  (64, 1024, SLOW), (1, 4, FAST), (1, 10, FAST), (7, 6, FAST)])
def test_fp32_equals_the_plain_path(batch, n_keys, shape):
    case = attention_case(batch, n_keys, torch.float32, **shape)
    for got, expected in zip(kernel(*case, n_keys), plain(*case, n_keys), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [SLOW, FAST])
def test_bf16_is_as_close_to_fp32_as_the_plain_bf16_path(shape):
    n_keys = 512 if shape is SLOW else 10
    case = attention_case(16, n_keys, torch.bfloat16, **shape)
    attn, *tensors = case
    reference = plain(attn.float(), *(t if t.dtype == torch.int64 else t.float() for t in tensors), n_keys)
    attn = attn.to(torch.bfloat16)
    ops = plain(attn, *tensors, n_keys)
    got = kernel(attn, *tensors, n_keys)
    assert got[0].dtype == torch.bfloat16
    for name, g, o, r in zip(("out", "keys", "values"), got, ops, reference, strict=True):
        assert (g.float() - r).abs().max() <= 2 * (o.float() - r).abs().max() + 1e-6, name


def one_row_arguments(attn, qkv, rope, k_cache, v_cache, positions, n_keys):
    return (qkv, *attn.kernel_norms(), rope.reshape(1, -1), k_cache, v_cache, positions, n_keys, attn.n_head)


@pytest.mark.parametrize("n_keys, shape", [(512, SLOW), (300, SLOW), (10, FAST), (4, FAST)])
def test_the_one_row_op_launched_with_pdl_equals_the_op_for_batches(n_keys, shape):
    """decode_attention_one_row (the batch-1 step's: the same kernels, launched with programmatic
    dependent launch) gives the bits of decode_attention, KV writes included. It runs first, on
    scratch blocks the caching allocator last handed out full of NaN: a merge that read the splits
    before the attention had written them would return NaN."""
    attn, qkv, rope, k_cache, v_cache, positions = case = attention_case(1, n_keys, torch.bfloat16, **shape)
    splits = max(1, -(-n_keys // attention_kernel.ONE_ROW_SPLIT_KEYS))
    group, head_dim = attn.n_head // attn.n_kv_heads, attn.head_dim
    poisoned = [torch.full(size, float("nan"), device="cuda") for size in
                ((1, attn.n_kv_heads, splits, group, head_dim), (1, attn.n_kv_heads, splits, group))]
    del poisoned  # freed: the op's torch.empty of these sizes gets these blocks back
    k_got, v_got = k_cache.clone(), v_cache.clone()
    out = attention_kernel.decode_attention_one_row(*one_row_arguments(attn, qkv, rope, k_got, v_got, positions, n_keys))
    expected = kernel(*case, n_keys)
    assert torch.equal(out, expected[0]) and torch.equal(k_got, expected[1]) and torch.equal(v_got, expected[2])


def test_the_one_row_op_declares_its_mutations_and_fake_shapes():
    """torch.library.opcheck: the schema's mutated caches, the fake implementation's output, and
    dispatch under torch.compile's tracing agree with what the op does."""
    attn, qkv, rope, k_cache, v_cache, positions = attention_case(1, 300, torch.bfloat16, **SLOW)
    torch.library.opcheck(attention_kernel.decode_attention_one_row,
                          one_row_arguments(attn, qkv, rope, k_cache, v_cache, positions, 300),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_only_the_new_position_of_each_row_is_written():
    attn, qkv, rope, k_cache, v_cache, positions = attention_case(4, 384, torch.float32, **SLOW)
    _, k_new, v_new = kernel(attn, qkv, rope, k_cache, v_cache, positions, 384)
    written = torch.zeros_like(k_cache, dtype=torch.bool)
    written[torch.arange(4, device="cuda"), :, positions] = True
    assert torch.equal(k_new[~written], k_cache[~written]) and torch.equal(v_new[~written], v_cache[~written])
    assert not torch.equal(k_new[written], k_cache[written])


def test_keys_past_a_rows_position_are_never_read():
    """NaNs past every row's new position change nothing: those keys and values are not touched."""
    attn, qkv, rope, k_cache, v_cache, positions = attention_case(8, 512, torch.bfloat16, **SLOW)
    expected = kernel(attn, qkv, rope, k_cache, v_cache, positions, 512)[0]
    past = torch.arange(4096, device="cuda")[None, None, :, None] >= positions[:, None, None, None]
    poisoned = [t.masked_fill(past, float("nan")) for t in (k_cache, v_cache)]
    assert torch.equal(kernel(attn, qkv, rope, *poisoned, positions, 512)[0], expected)


def test_compiled_attend_in_a_cuda_graph_takes_the_kernel_and_reads_positions_at_replay():
    """Attention.attend compiled with the kernel on (as the step runner's blocks are: the KV views
    are inputs, K and V tensors of their own) and captured, replayed after the positions changed,
    equals the kernel run eagerly, KV writes included."""
    attn, qkv, rope, k_cache, v_cache, positions = attention_case(4, 512, torch.bfloat16, **SLOW)
    assert attn.use_decode_kernel()
    keys = torch.arange(512, device="cuda")

    def views(k, v):
        return KVView(k, v, positions[:, None], keys, keys <= positions[:, None, None, None])

    compiled = torch.compile(attn.attend, fullgraph=True, dynamic=True)
    compiled(qkv[:, None], rope, views(k_cache.clone(), v_cache.clone()))
    k_graph, v_graph = k_cache.clone(), v_cache.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(qkv[:, None], rope, views(k_graph, v_graph))
    positions.fill_(511)  # a replay reads the positions as they are then, and writes there
    k_graph.copy_(k_cache)
    v_graph.copy_(v_cache)
    graph.replay()
    expected, k_expected, v_expected = kernel(attn, qkv, rope, k_cache, v_cache, positions, 512)
    torch.testing.assert_close(out[:, 0], expected)
    assert torch.equal(k_graph, k_expected) and torch.equal(v_graph, v_expected)
