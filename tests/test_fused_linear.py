"""The decode step's fused projection kernel against the plain ops (CUDA with Triton only)."""

import pytest
import torch
import torch.nn.functional as F

from engine import quantization
from engine.model.dual_ar import Block, KVView, RMSNorm, rope_table

pytestmark = pytest.mark.gpu
fused = None  # engine.model.fused_linear, imported once a test runs: it needs Triton, which a CPU machine may lack


@pytest.fixture(scope="module", autouse=True)
def triton_module():
    global fused
    fused = pytest.importorskip("engine.model.fused_linear", reason="needs Triton")


def plain(x, weight, norm_weight, residual, eps, gated):
    """What Block.forward computes around one projection, in the eager ops."""
    if norm_weight is not None:
        norm = RMSNorm(x.shape[-1], eps).to(x.device, x.dtype)
        norm.weight.data.copy_(norm_weight)
        x = norm(x)
    y = F.linear(x, weight)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if residual is None else residual + y


def kernel(x, weight, norm_weight, residual, eps, gated, weight_scale=None):
    """fused_linear with the operands in plain()'s order."""
    return fused.fused_linear(x, weight, weight_scale, norm_weight, residual, eps, gated)


def operands(rows, depth, columns, norm, gated, residual, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    return (randn(rows, depth), randn((2 if gated else 1) * columns, depth, scale=depth ** -0.5),
            (1 + randn(depth, scale=0.1)) if norm else None, randn(rows, columns) if residual else None, 1e-6, gated)


# S1-mini's projections (qkv with its norm, wo with the residual, the gated FFN, the down projection)
# and the demo model's odd sizes, which are not multiples of any block.
SHAPES = [(1024, 4096, True, False, False), (2048, 1024, False, False, True), (1024, 3072, True, True, False),
          (3072, 1024, False, False, True), (24, 128, True, False, False), (64, 24, False, False, True),
          (24, 48, True, True, False)]


@pytest.mark.parametrize("shape", SHAPES)
def test_fp32_equals_the_plain_ops(shape):
    ops = operands(1, *shape, torch.float32)
    torch.testing.assert_close(kernel(*ops), plain(*ops), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES[:4])
def test_bf16_is_as_close_to_fp32_as_the_plain_bf16_ops(shape):
    ops = operands(1, *shape, torch.bfloat16)
    as_fp32 = [t.float() if isinstance(t, torch.Tensor) else t for t in ops]
    reference = plain(*as_fp32)
    kernel_error = (kernel(*ops).float() - reference).abs().max()
    plain_error = (plain(*ops).float() - reference).abs().max()
    assert kernel_error <= 1.5 * plain_error + 1e-3


@pytest.mark.parametrize("hint", ["evict_first", "evict_last"])
def test_an_l2_cache_hint_changes_no_result(hint):
    """The slow and fast blocks load their weights with L2 hints (DualARTransformer.weight_cache_hints)."""
    for shape in SHAPES[:4]:
        x, weight, norm_weight, residual, eps, gated = operands(1, *shape, torch.bfloat16)
        without = fused.fused_linear(x, weight, None, norm_weight, residual, eps, gated)
        assert torch.equal(fused.fused_linear(x, weight, None, norm_weight, residual, eps, gated, hint), without)


def int8_rows(weight):
    """weight as int8 with one scale per row, the scales (R,), and the weight those give back."""
    q, scale = quantization.int8_rows(weight)
    return q, scale.view(-1), q.float() * scale


@pytest.mark.parametrize("shape", SHAPES[:4] + SHAPES[-1:])
def test_int8_weights_with_row_scales_are_as_close_as_the_plain_ops_on_their_dequantized_weights(shape):
    x, weight, *rest = operands(1, *shape, torch.bfloat16)
    q, scale, dequantized = int8_rows(weight)
    as_fp32 = [t.float() if isinstance(t, torch.Tensor) else t for t in rest]
    reference = plain(x.float(), dequantized, *as_fp32)
    kernel_error = (kernel(x, q, *rest, weight_scale=scale).float() - reference).abs().max()
    plain_error = (plain(x, dequantized.to(torch.bfloat16), *rest).float() - reference).abs().max()
    assert kernel_error <= 1.5 * plain_error + 1e-3


def full_size_block(dtype):
    torch.manual_seed(0)
    block = Block(1024, 16, 8, 128, 3072, 1e-6, True, False, False).to("cuda", dtype)
    for name, param in block.named_parameters():
        param.data = (torch.randn_like(param) * (0.02 if "weight" in name and param.dim() == 2 else 0.1)
                      + (1.0 if "norm" in name else 0.0))
    block.feed_forward.fuse_gate_up()
    return block


@pytest.mark.parametrize("quantize", ["none", "int8"])
@torch.inference_mode()
def test_a_compiled_block_with_fused_projections_in_a_cuda_graph_equals_the_eager_block(monkeypatch, quantize):
    """The path Block takes in the compiled batch-1 decode step (one row, one position, in a CUDA
    graph): fp32, equal to the eager block, KV writes included; with int8 weights (torchao's, as
    --quantize int8 makes them), equal to the eager block on the same weights. On Hopper every kernel
    of it is launched with programmatic dependent launch, each starting while the one before runs: an
    attention that read the projected token, or a merge that read the splits, before its wait would
    read graph-pool memory not yet written at this first replay. (The loads a kernel makes before its
    wait read what kernels long finished wrote; tests/test_gpu.py's graphed steps cover those.)"""
    import types

    from engine.model import dual_ar

    traced = []
    monkeypatch.setattr(dual_ar, "projection_kernel", types.SimpleNamespace(
        fused_linear=lambda *args: traced.append(args) or fused.fused_linear(*args)))
    block = full_size_block(torch.float32)
    if quantize == "int8":
        pytest.importorskip("torchao")
        quantize_block_int8(block)
    assert block.use_fused_projections() and block.attention.use_decode_kernel()
    batch, capacity, position = 1, 512, 300  # split over 5 programs a kv head, then merged, as the step's slow layers
    x = torch.randn(batch, 1, 1024, device="cuda")
    positions = torch.full((batch, 1), position, device="cuda")
    rope = rope_table(capacity, 128, 1e6).cuda()[positions]
    mask = torch.ones(batch, 1, 1, position + 1, dtype=torch.bool, device="cuda")
    cache = [torch.randn(batch, 8, capacity, 128, device="cuda") for _ in range(2)]  # K and V apart, as KVCache has them

    def run(fn, kv_cache):
        return fn(x, rope, KVView(kv_cache[0], kv_cache[1], positions, torch.arange(position + 1, device="cuda"), mask))

    def clone(kv_cache):
        return [t.clone() for t in kv_cache]

    eager_cache, graph_cache = clone(cache), clone(cache)
    expected = run(block, eager_cache)
    compiled = torch.compile(block, fullgraph=True)
    run(compiled, clone(cache))  # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(compiled, graph_cache)
    graph.replay()
    # The compiled block went through the four fused projections (Dynamo replays the list appends
    # of its trace on every call).
    assert traced and len(traced) % 4 == 0
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    for got, expected_cache in zip(graph_cache, eager_cache, strict=True):
        torch.testing.assert_close(got, expected_cache, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_fused_output_head_equals_the_plain_one_and_more_rows_take_the_plain_ops(dtype):
    from engine.model.dual_ar import fused_norm_then_linear, norm_then_linear

    norm = RMSNorm(1024, 1e-6).to("cuda", dtype)
    norm.weight.data = 1 + 0.1 * torch.randn_like(norm.weight)
    weight = (torch.randn(4097, 1024, device="cuda") * 0.03).to(dtype)
    for x in (torch.randn(1, 1, 1024, device="cuda").to(dtype), torch.randn(3, 1024, device="cuda").to(dtype)):
        expected = norm_then_linear(norm, weight, x)
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(fused_norm_then_linear(norm, weight, x), expected, rtol=tolerance, atol=tolerance)


def quantize_block_int8(block):
    block.feed_forward.fuse_gate_up(as_linear=True)
    quantization._torchao().quantize_(block, quantization._config("int8"))


def test_int8_weights_take_the_kernels_and_other_quantized_or_biased_ones_keep_the_plain_projections():
    pytest.importorskip("torchao")
    block = full_size_block(torch.bfloat16)
    quantize_block_int8(block)
    assert block.use_fused_projections()
    if torch.cuda.get_device_capability() >= (8, 0):
        int4 = full_size_block(torch.bfloat16)
        int4.feed_forward.fuse_gate_up(as_linear=True)
        quantization._torchao().quantize_(int4, quantization._config("int4"))
        assert not int4.use_fused_projections()
    biased = Block(1024, 16, 8, 128, 3072, 1e-6, True, True, False).to("cuda", torch.bfloat16)
    biased.feed_forward.fuse_gate_up()
    assert not biased.use_fused_projections()
