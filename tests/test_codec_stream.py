"""Streaming codec decode (engine/model/codec_stream.py) against whole-utterance ModdedDAC.decode.

Tolerances. fp32 streaming differs from fp32 whole decode only by rounding (different conv lengths pick
different kernels and sum orders), but this decoder amplifies rounding: on the fixture codec a whole
fp32 decode is itself ~6e-5 (max abs, audio peak ~1) away from a float64 decode. So besides an absolute
bound, the fp32 tests check that streaming is no further from the float64 decode than whole fp32 is, and
one test streams in float64, where only the codec's own fp32 islands (RoPE, RMSNorm) round.
"""

import copy
import dataclasses

import numpy as np
import pytest
import torch

from engine.model.codec import load_codec, random_codec
from engine.model.codec_transformer import WindowLimitedTransformer, layer_forward
from engine.model.codec_config import CodecConfig
from engine.model.codec_stream import StreamingDecoder, StreamingEncoder, decode_chunked, encode_chunked
from engine.model.codec_streamers import compiled_layer_forward
from codec_codes import NEAR_TIE, assert_same_codes_but_near_ties, vq_margins

T = 120  # frames: longer than every window and receptive field of the test codecs
FP32_ATOL = 1e-4  # stream vs whole, fp32 (measured <= 8e-5 on the fixture codec, <= 3.2e-5 random)
AUDIO_ATOL = 2e-4  # fixtures README: decoded audio vs the reference


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The per-chunk ops are tiny: on a loaded CPU, waking OpenMP threads costs 50x the work itself.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def random_codes(config: CodecConfig, batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    sizes = [config.semantic_codebook_size] + [config.residual_codebook_size] * config.n_residual_codebooks
    return torch.stack([torch.randint(0, n, (batch, frames), generator=gen) for n in sizes], dim=1)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, (a.shape, b.shape, a.dtype, b.dtype)
    return (a - b).abs().max().item()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def wider_config(codec_dir) -> CodecConfig:
    """The fixture codec's config with a longer transformer window (24), grouped-query attention and
    a 512-row table."""
    tiny = CodecConfig.from_json(codec_dir / "config.json")
    qt = dataclasses.replace(tiny.quantizer_transformer, window_size=24, block_size=512, n_local_heads=2)
    return dataclasses.replace(tiny, quantizer_transformer=qt)


SCHEDULES = {
    "ones": 1,
    "threes": 3,
    "sevens": 7,
    "fifty": 50,
    "one_big": T,
    "primes": [2, 3, 5, 7, 11, 13, 17],
    "random": torch.randint(1, 20, (40,), generator=torch.Generator().manual_seed(7)).tolist(),
}


@pytest.fixture(scope="module")
def fixture_codec(codec_dir):
    return load_codec(codec_dir / "codec.pth", CodecConfig.from_json(codec_dir / "config.json"))


@pytest.fixture(scope="module")
def wide_codec(wider_config):
    return random_codec(wider_config, seed=5)


class Whole:
    """Whole decodes of one code sequence in fp32 and float64."""

    def __init__(self, codec, codes):
        self.codec, self.codes = codec, codes
        self.codec64 = copy.deepcopy(codec).double()
        with torch.inference_mode():
            self.fp32 = codec.decode(codes)
            self.fp64 = self.codec64.decode(codes)
        self.fp32_vs_fp64 = max_diff(self.fp32, self.fp64)


@pytest.fixture(scope="module")
def fixture_whole(fixture_codec):
    return Whole(fixture_codec, random_codes(fixture_codec.config, 1, T, seed=1))


@pytest.fixture(scope="module")
def wide_whole(wide_codec):
    return Whole(wide_codec, random_codes(wide_codec.config, 1, T, seed=2))


def check_fp32_stream(whole: Whole, schedule) -> float:
    with torch.inference_mode():
        audio = decode_chunked(whole.codec, whole.codes, schedule)
    assert audio.shape == (1, 1, T * whole.codec.config.frame_length)
    err = max_diff(audio, whole.fp32)
    assert err <= FP32_ATOL, f"stream vs whole fp32: {err:.3g}"
    # As close to the float64 decode as the whole fp32 decode is (rounding, not a streaming error).
    err64 = max_diff(audio, whole.fp64)
    assert err64 <= 2 * whole.fp32_vs_fp64, f"stream {err64:.3g} vs whole {whole.fp32_vs_fp64:.3g} from fp64"
    return err


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_fixture_codec_stream_equals_whole_decode(fixture_whole, schedule):
    check_fp32_stream(fixture_whole, schedule)


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_wide_window_gqa_codec_stream_equals_whole_decode(wide_whole, schedule):
    check_fp32_stream(wide_whole, schedule)


@pytest.mark.parametrize("schedule", [1, [2, 3, 5, 7, 11, 13, 17]], ids=["ones", "primes"])
def test_float64_stream_equals_whole_decode(fixture_whole, wide_whole, schedule):
    # Only the codec's fp32 islands round here: a cache or mask error would be >> 1e-3.
    for whole in (fixture_whole, wide_whole):
        with torch.inference_mode():
            audio = decode_chunked(whole.codec64, whole.codes, schedule)
        assert max_diff(audio, whole.fp64) <= 2e-5


def test_stream_matches_reference_audio(fixture_codec, codec_expected):
    codes = codec_expected["decode_codes"]
    for schedule in (1, [5, 7]):
        with torch.inference_mode():
            audio = decode_chunked(fixture_codec, codes, schedule)
        assert max_diff(audio, codec_expected["decode_audio"]) <= AUDIO_ATOL


def test_unfused_weight_norm_codec_streams(codec_dir, fixture_codec, fixture_whole):
    # The checkpoint layout (WNConv with g, v) streams like the fused one.
    unfused = load_codec(codec_dir / "codec.pth", fixture_codec.config, for_inference=False)
    codes = fixture_whole.codes[..., :40]
    with torch.inference_mode():
        audio = decode_chunked(unfused, codes, [3, 4])
        whole = fixture_codec.decode(codes)
    assert max_diff(audio, whole) <= FP32_ATOL


def test_stream_past_rope_table_end_equals_codec_with_longer_table(wider_config):
    # block_size 64: a whole decode stops there; the stream goes on with rows of the same formula, so
    # it equals a whole decode by the same weights with a 512-row table.
    wide = wider_config
    short_qt = dataclasses.replace(wide.quantizer_transformer, block_size=64)
    short = dataclasses.replace(wide, quantizer_transformer=short_qt)
    short_codec, long_codec = random_codec(short, seed=5), random_codec(wide, seed=5)
    codes = random_codes(wide, 1, 200, seed=3)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="at most 64"):
            short_codec.decode(codes)
        whole = long_codec.decode(codes)
        dec = StreamingDecoder(short_codec)
        audio = torch.cat([dec.decode(codes[..., t : t + 9]) for t in range(0, 200, 9)], -1)
    assert dec.frames.tolist() == [200]
    assert max_diff(audio, whole) <= FP32_ATOL
    # The tail (frames 150..199, all past row 64) carries the same signal, not a degraded one.
    tail = slice(150 * wide.frame_length, None)
    assert rel_err(audio[..., tail], whole[..., tail]) < 1e-4


def test_reset_starts_an_independent_utterance(wide_codec):
    a, b = random_codes(wide_codec.config, 1, 60, seed=10), random_codes(wide_codec.config, 1, 45, seed=11)
    with torch.inference_mode():
        fresh = decode_chunked(wide_codec, b, 4)
        dec = StreamingDecoder(wide_codec)
        for t in range(0, 60, 7):
            dec.decode(a[..., t : t + 7])
        carried = torch.cat([dec.decode(b[..., t : t + 4]) for t in range(0, 45, 4)], -1)
        dec.reset()
        assert dec.frames.tolist() == [0]
        after_reset = torch.cat([dec.decode(b[..., t : t + 4]) for t in range(0, 45, 4)], -1)
    assert torch.equal(after_reset, fresh)
    # Without the reset the first utterance's state leaks in (so the state is really carried).
    assert max_diff(carried, fresh) > 1e-2


def test_batch_rows_are_independent(wide_codec):
    codes = random_codes(wide_codec.config, 3, 50, seed=12)
    with torch.inference_mode():
        whole = wide_codec.decode(codes)
        batched = decode_chunked(wide_codec, codes, [1, 6, 4])
        rows = [decode_chunked(wide_codec, codes[i : i + 1], [1, 6, 4]) for i in range(3)]
    assert max_diff(batched, whole) <= FP32_ATOL
    for i in range(3):
        assert max_diff(batched[i : i + 1], rows[i]) <= FP32_ATOL
    assert max_diff(batched[0], batched[1]) > 1e-2  # different codes, different audio


@pytest.mark.parametrize("schedule", [1, 7, [2, 3, 5, 7, 11, 13, 17]], ids=["ones", "sevens", "primes"])
def test_bf16_stream_as_accurate_as_bf16_whole(fixture_whole, schedule):
    # In bf16 this tiny decoder amplifies rounding to ~8% (Snake of activations in the hundreds, where a
    # bf16 ulp is 2-4): a stream and a whole decode round differently, so both are compared with fp32.
    bf16 = copy.deepcopy(fixture_whole.codec).to(torch.bfloat16)
    ref = fixture_whole.fp32
    with torch.inference_mode():
        whole = bf16.decode(fixture_whole.codes)
        stream = decode_chunked(bf16, fixture_whole.codes, schedule)
    assert stream.dtype == torch.float32 and stream.shape == ref.shape
    assert rel_err(stream, ref) <= 1.25 * rel_err(whole, ref)
    assert rel_err(stream, whole) < 0.15 and max_diff(stream, whole) < 0.3


def test_each_call_costs_only_its_own_frames(wide_codec):
    codec = copy.deepcopy(wide_codec)
    codes = random_codes(codec.config, 1, 103, seed=13)
    work, seen = [0], []
    mods = [m for m in codec.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d))]

    def count(m, args, out):
        work[0] += args[0].numel()

    def counted_layer(h, *args):  # the streamed post-transformer's layers take their weights as tensors
        work[0] += h.numel()
        seen.append(h.shape[1])
        return layer_forward(h, *args)

    codec.quantizer.post_module.stream_layers_with(counted_layer)
    handles = [m.register_forward_hook(count) for m in mods]
    try:
        with torch.inference_mode():
            dec = StreamingDecoder(codec)
            dec.decode(codes[..., :10])
            work[0] = 0
            dec.decode(codes[..., 10:13])
            early = work[0]
            dec.decode(codes[..., 13:100])
            work[0] = 0
            dec.decode(codes[..., 100:103])
            late = work[0]
    finally:
        for h in handles:
            h.remove()
    assert early == late > 0
    layers = len(codec.quantizer.post_module.layers)
    # the transformer sees only the new frames (the rest is in its cache)
    assert seen == [n for n in (10, 3, 87, 3) for _ in range(layers)]


def test_bad_input_is_a_clear_error(wide_codec):
    dec = StreamingDecoder(wide_codec, batch=2)
    codes = random_codes(wide_codec.config, 2, 5)
    with torch.inference_mode():
        with pytest.raises(ValueError, match=r"codes must be \(2, 10, n\)"):
            dec.decode(codes[:1])
        with pytest.raises(ValueError, match=r"codes must be \(2, 10, n\)"):
            dec.decode(codes[:, :9])
        empty = dec.decode(codes[..., :0])
        assert empty.shape == (2, 1, 0) and dec.frames.tolist() == [0, 0]
        assert dec.decode(codes).shape == (2, 1, 5 * wide_codec.config.frame_length)
    with pytest.raises(ValueError, match="chunk sizes"):
        decode_chunked(wide_codec, codes, [3, 0])
    with pytest.raises(ValueError, match="batch"):
        StreamingDecoder(wide_codec, batch=0)


# --- CUDA ---------------------------------------------------------------------------------------


@pytest.fixture
def no_tf32():
    # cuDNN runs fp32 convs in TF32 by default: whole and streamed decodes would differ by ~1e-2.
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
def test_cuda_stream_fp32_bf16_and_graph_capture(fixture_codec, no_tf32):
    codec = copy.deepcopy(fixture_codec).cuda()
    codes = random_codes(codec.config, 2, 64, seed=14).cuda()
    with torch.inference_mode():
        whole = codec.decode(codes)
        err = max_diff(decode_chunked(codec, codes, [1, 5, 3]), whole)
        assert err <= FP32_ATOL, f"cuda fp32 stream vs whole: {err:.3g}"

        bf16 = copy.deepcopy(codec).to(torch.bfloat16)
        whole_bf16 = bf16.decode(codes)
        stream_bf16 = decode_chunked(bf16, codes, [1, 5, 3])
        errs = rel_err(stream_bf16, whole), rel_err(whole_bf16, whole)
        assert errs[0] <= 1.25 * errs[1] + 0.01, f"bf16 stream / whole vs fp32: {errs}"

        # One fixed chunk size captured once, replayed for every chunk: same audio as eager streaming.
        n = 4
        eager = decode_chunked(bf16, codes, n)
        dec = StreamingDecoder(bf16, batch=2)
        static = codes[..., :n].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                dec.decode(static)
        torch.cuda.current_stream().wait_stream(side)
        dec.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = dec.decode(static)
        dec.reset()
        pieces = []
        for t in range(0, 64, n):
            static.copy_(codes[..., t : t + n])
            graph.replay()
            pieces.append(out.clone())
        replayed = torch.cat(pieces, -1)
    assert max_diff(replayed, eager) <= 1e-2 * eager.abs().max().item()  # the same kernels: 0 in practice


# --- the post-transformer's layers compiled (codec_runner.set_up_codec) ---------------------------


def compiled_layers_codec(codec, backend):
    """A copy of codec whose streamed post-transformer runs layer_forward through torch.compile."""
    compiled = copy.deepcopy(codec)
    compiled.quantizer.post_module.stream_layers_with(compiled_layer_forward(backend))
    return compiled


def decode_rows_apart(codec, codes: torch.Tensor) -> torch.Tensor:
    """Two streams of 24 frames, codes (2, K, 24), decoded as the engine's calls come: each alone,
    then both at once in rows given out of order, then one alone again. -> (2, 1, samples)."""
    dec = StreamingDecoder(codec, batch=3)
    with torch.inference_mode():
        a = [dec.decode(codes[:1, :, :4], rows=[2])]
        b = [dec.decode(codes[1:, :, :8], rows=[0])]
        both = dec.decode(torch.stack([codes[0, :, 4:20], codes[1, :, 8:24]]), rows=[2, 0])
        a += [both[:1], dec.decode(codes[:1, :, 20:], rows=[2])]
        b.append(both[1:])
    return torch.cat([torch.cat(a, -1), torch.cat(b, -1)])


def test_compiled_post_transformer_layers_are_traced_whole_once_for_every_shape(wide_codec):
    """One graph of layer_forward (fullgraph) serves every layer, row count and chunk length past
    the first call's (a row count of one is a graph of its own): no recompile per layer, which would
    fail the call once torch.compile's recompile limit is reached (fullgraph). Traced only (Dynamo's
    CompileCounter runs the graph as traced): the same audio as the plain layers."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    codes = random_codes(wide_codec.config, 2, 24, seed=21)
    plain = decode_rows_apart(wide_codec, codes)
    traced = decode_rows_apart(compiled_layers_codec(wide_codec, counter), codes)
    assert torch.equal(traced, plain)
    assert len(wide_codec.quantizer.post_module.layers) > 1
    assert counter.frame_count == 2  # one row, then the dynamic graph for more


def test_set_up_codec_compiles_the_streamed_transformers_only_with_triton_and_plain_weights(fixture_codec, monkeypatch):
    pytest.importorskip("torchao")
    from engine.compilation import CompilePolicy as Policy
    from engine.model import conv_kernel
    from engine.quantization import quantize_codec
    from engine.runtime.codec_runner import set_up_codec, streamed_transformers

    monkeypatch.setattr(conv_kernel, "TRITON_OPS", conv_kernel.TORCH_OPS)  # stands in on a machine without Triton
    compiled, again, eager, int8 = (copy.deepcopy(fixture_codec) for _ in range(4))
    quantize_codec(int8, "int8")  # torchao's weights: the layers stay as written
    for codec, compiles in ((compiled, True), (again, True), (eager, False), (int8, True)):
        set_up_codec(codec, Policy(compile=compiles, cuda_graphs=True, reason="test"))
    transformers = streamed_transformers(compiled)
    # every transformer of the codec: the post-transformer, the encoder's and the pre-transformer
    assert len(transformers) == 3 and set(map(id, transformers)) == {
        id(m) for m in compiled.modules() if isinstance(m, WindowLimitedTransformer)}
    layer = compiled.quantizer.post_module.stream_layer
    # one compiled function per policy: each wrapper's graphs would count against one recompile limit
    assert layer is not None and all(m.stream_layer is layer for m in transformers)
    assert all(m.stream_layer is layer for m in streamed_transformers(again))
    assert all(m.stream_layer is None for m in streamed_transformers(eager))
    assert int8.quantizer.post_module.stream_layer is None
    # the encoder's residual units fused with compiled pointwise passes, one set per policy
    assert compiled.encoder.stream_pointwise is not None and again.encoder.stream_pointwise is compiled.encoder.stream_pointwise
    assert eager.encoder.stream_pointwise is None


def encode_path_head_layouts(codec) -> set:
    """The head layouts of the encode path's transformers: each compiles graphs of its own."""
    from engine.runtime.codec_runner import streamed_transformers

    return {(m.layers[0].attention.head_dim, m.layers[0].attention.wqkv.weight.shape)
            for m in streamed_transformers(codec)[1:]}


def test_compiled_encode_path_layers_are_traced_whole_once_for_every_shape(fixture_codec):
    """The encoder's and the pre-transformer's layers through one compiled layer_forward (traced
    only: CompileCounter runs the graphs as traced), as the reference encoder runs them: batches of
    one and of three clips, chunk after chunk. The same codes as the plain layers, and a graph per
    head layout and row count (one row, then the dynamic one), not per layer or chunk: the fixture's
    encoder and pre-transformer have projections of one shape but other heads, which must not turn
    the head layout into symbols (a call would fail)."""
    from torch._dynamo.testing import CompileCounter

    from engine.runtime.codec_runner import streamed_transformers

    torch._dynamo.reset()
    counter = CompileCounter()
    traced = copy.deepcopy(fixture_codec)
    layer = compiled_layer_forward(counter)
    for transformer in streamed_transformers(traced)[1:]:  # the encode path's
        transformer.stream_layers_with(layer)
    gen = torch.Generator().manual_seed(9)
    frame_length = fixture_codec.config.frame_length
    for rows in (1, 3):
        audio = 0.3 * torch.randn(rows, 1, 12 * frame_length, generator=gen)
        with torch.inference_mode():
            assert torch.equal(encode_chunked(traced, audio, 4), encode_chunked(fixture_codec, audio, 4))
    assert counter.frame_count == 2 * len(encode_path_head_layouts(traced))


@pytest.mark.gpu
def test_compiled_post_transformer_layers_decode_as_the_plain_ones_on_cuda(fixture_codec, no_tf32):
    """Inductor's kernels (as the engine compiles them) against the plain layers: in fp32 within fp32
    rounding; in bf16 as close to the fp32 audio as the plain bf16 layers are. (Not bf16 against bf16:
    Inductor rounds a fused chain of operations once where eager PyTorch rounds after each, and the
    fixture codec amplifies such differences to ~0.17 of its peak.)"""
    from engine import compilation

    policy = compilation.decide("on", torch.device("cuda"))
    if not policy.compile:
        pytest.skip(f"no compile on this CUDA machine: {policy.reason}")
    torch._dynamo.reset()
    codes = random_codes(fixture_codec.config, 2, 24, seed=22).cuda()
    decoded = {}
    for dtype in (torch.float32, torch.bfloat16):
        codec = copy.deepcopy(fixture_codec).cuda().to(dtype)
        decoded[dtype] = (decode_rows_apart(codec, codes),
                          decode_rows_apart(compiled_layers_codec(codec, policy.inductor_backend()), codes))
    reference, compiled = decoded[torch.float32]
    assert max_diff(compiled, reference) <= FP32_ATOL * max(1.0, reference.abs().max().item())
    errs = [rel_err(audio, reference) for audio in decoded[torch.bfloat16]]
    assert errs[1] <= 1.25 * errs[0] + 0.01, f"bf16 plain / compiled vs fp32: {errs}"


def test_fused_encoder_residuals_with_compiled_passes_give_the_reference_codes(fixture_codec, codec_expected):
    """The encoder's residual units fused, their pointwise passes through torch.compile (traced
    only: CompileCounter runs the graphs as traced), as the engine encodes when it compiles: the
    reference's codes wherever no VQ near-tie could flip (the fused passes round in another order),
    batches of one and three rows, a graph per pass and row count, not per block or chunk."""
    from torch._dynamo.testing import CompileCounter

    from engine.model.codec_streamers import compiled_pointwise

    torch._dynamo.reset()
    counter = CompileCounter()
    fused = copy.deepcopy(fixture_codec)
    fused.encoder.stream_pointwise_with(compiled_pointwise(counter))
    with torch.inference_mode():
        for group in encode_groups(codec_expected):
            audio = codec_expected[f"{group}_pcm16"].float() / 32768
            expected, robust = codec_expected[f"{group}_codes"], codec_expected[f"{group}_codes_robust"]
            for rows in (1, 3):
                codes = encode_chunked(fused, audio.expand(rows, -1, -1).contiguous(), 4)
                assert all(torch.equal(row[robust[0]], expected[0][robust[0]]) for row in codes), group
    assert counter.frame_count == 2 * 3  # three passes, each for one row and for more, every block width


def test_encode_path_compiled_by_inductor_gives_the_plain_codes_from_a_graph_per_pass_and_row_kind(fixture_codec):
    """The encode path's compiled passes and layers lowered by Inductor itself (on the CPU here; the
    GPU machines run one torch, CI the pinned and the newest, where Inductor's handling of dynamic
    sizes changes): batches of one, three and two rows, then one again, with the plain path's codes
    (fp32 on the CPU: the same sums in another order, so no near-tie flips in the fixture), from a
    graph per pass and head layout for one row and one for more, not per row count, block or chunk."""
    from engine.compilation import CompilePolicy
    from engine.model.codec_streamers import compiled_pointwise
    from engine.runtime.codec_runner import streamed_transformers

    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    backend = CompilePolicy(compile=True, cuda_graphs=False, reason="test", pdl=False).inductor_backend()
    compiled = copy.deepcopy(fixture_codec)
    compiled.encoder.stream_pointwise_with(compiled_pointwise(backend))
    layer = compiled_layer_forward(backend)
    for transformer in streamed_transformers(compiled)[1:]:  # the encode path's
        transformer.stream_layers_with(layer)
    gen = torch.Generator().manual_seed(9)
    for rows in (1, 3, 2, 1):
        audio = 0.3 * torch.randn(rows, 1, 12 * fixture_codec.config.frame_length, generator=gen)
        with torch.inference_mode():
            assert torch.equal(encode_chunked(compiled, audio, 4), encode_chunked(fixture_codec, audio, 4)), rows
    passes, layouts = 3, len(encode_path_head_layouts(compiled))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2 * (passes + layouts)


@pytest.mark.gpu
def test_compiled_encode_path_gives_the_codes_of_the_plain_one_on_cuda(fixture_codec, no_tf32):
    """The encode path as the engine compiles it (set_up_codec: fused residual units with
    Inductor's pointwise kernels, Inductor's transformer layers) against the plain modules, in fp32
    as the engine encodes: the same codes up to VQ near-ties."""
    from engine import compilation
    from engine.runtime.codec_runner import set_up_codec

    policy = compilation.decide("on", torch.device("cuda"))
    if not policy.compile:
        pytest.skip(f"no compile on this CUDA machine: {policy.reason}")
    torch._dynamo.reset()
    plain = copy.deepcopy(fixture_codec).cuda()
    compiled = copy.deepcopy(plain)
    set_up_codec(compiled, policy)
    gen = torch.Generator().manual_seed(10)
    audio = (0.3 * torch.randn(2, 1, 24 * fixture_codec.config.frame_length, generator=gen)).cuda()
    with torch.inference_mode():
        expected = encode_chunked(plain, audio, 8)
        got = encode_chunked(compiled, audio, 8)
        for row in range(2):
            margins = vq_margins(plain, audio[row:row + 1])
            assert_same_codes_but_near_ties(got[row].cpu(), expected[row].cpu(), margins.cpu(), NEAR_TIE)


# --- encoding in chunks (bounded memory for long reference clips) ---------------------------------


def encode_groups(codec_expected):
    return sorted({k.split("_")[0] for k in codec_expected if k.startswith("encode") and k.endswith("_pcm16")})


@pytest.mark.parametrize("chunk_frames", [1, 5, 16, 10_000])
def test_parity_chunked_encode_gives_the_reference_codes(fixture_codec, codec_expected, chunk_frames):
    for group in encode_groups(codec_expected):
        audio = codec_expected[f"{group}_pcm16"].float() / 32768
        robust = codec_expected[f"{group}_codes_robust"]
        with torch.inference_mode():
            chunked = encode_chunked(fixture_codec, audio, chunk_frames)
            whole = fixture_codec.encode(audio)
        expected = codec_expected[f"{group}_codes"]
        assert chunked.shape == expected.shape
        assert torch.equal(chunked[robust], expected[robust]), group
        assert (chunked == whole).float().mean() > 0.99, group  # at most a near-tie flips


def test_chunked_encode_rejects_bad_input(fixture_codec):
    with pytest.raises(ValueError, match="chunk_frames"):
        encode_chunked(fixture_codec, torch.zeros(1, 1, 4096), 0)
    with pytest.raises(ValueError, match="audio must be"):
        encode_chunked(fixture_codec, torch.zeros(1, 4096), 4)


def test_rows_stream_independently_and_decode_together(wide_codec):
    """Streams that start at different times, continued in one batched call each time, give each
    stream's own whole decode: what continuous batching across requests relies on."""
    cfg = wide_codec.config
    a, b, c = (random_codes(cfg, 1, n, seed=s) for n, s in ((40, 21), (33, 22), (25, 23)))
    with torch.inference_mode():
        dec = StreamingDecoder(wide_codec, batch=4)
        parts = {0: [], 2: [], 3: []}
        parts[2].append(dec.decode(a[..., :8], rows=[2]))  # stream a alone, in row 2
        dec.decode(random_codes(cfg, 1, 6, seed=24), rows=[0])  # row 0 holds a stale stream ...
        dec.reset(rows=[0])  # ... until reset for stream b; rows 2 and 3 are untouched
        out = dec.decode(torch.cat([b[..., :8], a[..., 8:16]]), rows=[0, 2])  # b and a together
        parts[0].append(out[:1]), parts[2].append(out[1:])
        parts[3].append(dec.decode(c[..., :5], rows=[3]))
        out = dec.decode(torch.cat([c[..., 5:25], b[..., 8:28], a[..., 16:36]]), rows=[3, 0, 2])  # any order
        parts[3].append(out[:1]), parts[0].append(out[1:2]), parts[2].append(out[2:])
        parts[0].append(dec.decode(b[..., 28:], rows=[0]))
        parts[2].append(dec.decode(a[..., 36:], rows=[2]))
        whole = {0: wide_codec.decode(b), 2: wide_codec.decode(a), 3: wide_codec.decode(c)}
        for row, pieces in parts.items():
            assert max_diff(torch.cat(pieces, -1), whole[row]) <= FP32_ATOL, f"row {row}"
        assert dec.frames.tolist() == [33, 0, 40, 25]
        with pytest.raises(ValueError, match="distinct indices below 4"):
            dec.decode(a[..., :2].repeat(2, 1, 1), rows=[1, 1])
        with pytest.raises(ValueError, match="distinct indices below 4"):
            dec.decode(a[..., :2], rows=[4])


def test_reference_encoder_gives_the_codes_of_a_whole_encode_for_any_clip_length(fixture_codec):
    """ReferenceEncoder pads every chunk, the last one included, to the same size (what its CUDA
    graph needs) and cuts the padding's frames; clips over its reserved length go to a fresh
    encoder. On the CPU in fp32 each equals one whole encode, except where a VQ stage was a near tie
    in the whole encode: the order of fp32 sums (the CPU's threads, its convolution algorithms) can
    tip those either way, and the codebooks after it in that frame follow."""
    from engine.runtime.reference_encoder import ReferenceEncoder

    frame_length = fixture_codec.config.frame_length
    encoder = ReferenceEncoder(fixture_codec, chunk_frames=4, max_frames=12)
    gen = torch.Generator().manual_seed(3)
    # under one chunk, a partial last frame, exactly three chunks, a partial chunk, over max_frames
    for samples in (frame_length - 5, 3 * frame_length + 7, 12 * frame_length, 10 * frame_length, 15 * frame_length):
        clip = (0.3 * torch.randn(samples, generator=gen)).numpy()
        with torch.inference_mode():
            whole = fixture_codec.encode(torch.from_numpy(clip).view(1, 1, -1))[0]
            margins = vq_margins(fixture_codec, torch.from_numpy(clip).view(1, 1, -1))
        assert_same_codes_but_near_ties(encoder.encode(clip), whole, margins, NEAR_TIE)
    with pytest.raises(ValueError, match="at least one sample"):
        encoder.encode(np.zeros(0, dtype=np.float32))
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        encoder.prepare()  # the graph is CUDA's; on the CPU the encoder stays eager


def test_a_batch_of_clips_gives_each_clip_the_codes_it_gets_alone(fixture_codec):
    """Clips of different lengths encoded as the rows of one batch (padded to the longest, the
    bucket's spare row silent): each gets its codes of an encode alone, up to VQ near-ties."""
    from engine.runtime.reference_encoder import ReferenceEncoder

    frame_length = fixture_codec.config.frame_length
    encoder = ReferenceEncoder(fixture_codec, chunk_frames=4, max_frames=12, max_batch=4)
    assert encoder.batches == [1, 2, 4]
    gen = torch.Generator().manual_seed(5)
    clips = [(0.3 * torch.randn(n, generator=gen)).numpy()
             for n in (9 * frame_length + 11, 2 * frame_length, 12 * frame_length)]  # 3 rows: bucket 4
    batched = [handle.result() for handle in encoder.start(clips)]
    for clip, codes in zip(clips, batched):
        with torch.inference_mode():
            margins = vq_margins(fixture_codec, torch.from_numpy(clip).view(1, 1, -1))
        assert_same_codes_but_near_ties(codes, encoder.encode(clip), margins, NEAR_TIE)
    with pytest.raises(ValueError, match="at most 4 clips of at most 12 frames"):
        encoder.start(clips * 2)
    with pytest.raises(ValueError, match="at most 4 clips of at most 12 frames"):
        encoder.start([clips[0], np.zeros(13 * frame_length, dtype=np.float32)])
    with pytest.raises(ValueError, match="at least one sample"):
        encoder.start([clips[0], np.zeros(0, dtype=np.float32)])


def test_a_lone_clip_encodes_in_chunks_of_its_own_size_to_the_codes_of_a_batched_pass(fixture_codec):
    """A pass of one clip runs lone_chunk_frames at a time, passes of more clips chunk_frames: the
    streamed encode carries its state across chunks, so the codes are the same up to VQ near-ties."""
    from engine.runtime.reference_encoder import ReferenceEncoder

    frame_length = fixture_codec.config.frame_length
    encoder = ReferenceEncoder(fixture_codec, chunk_frames=4, max_frames=12, max_batch=2, lone_chunk_frames=8)
    assert (encoder.chunk_samples(1), encoder.chunk_samples(2)) == (8 * frame_length, 4 * frame_length)
    lone = encoder._encoders[1]
    chunks, step = [], lone.step
    lone.step = lambda chunk: chunks.append(chunk.shape[-1]) or step(chunk)
    gen = torch.Generator().manual_seed(6)
    clip = (0.3 * torch.randn(11 * frame_length + 5, generator=gen)).numpy()  # 12 frames
    alone = encoder.encode(clip)
    assert chunks == [8 * frame_length, 8 * frame_length]  # the second padded past the clip's end
    assert alone.shape == (fixture_codec.config.num_codebooks, 12)
    paired = encoder.start([clip, clip[:5 * frame_length]])[0].result()  # three chunks of 4 frames
    with torch.inference_mode():
        margins = vq_margins(fixture_codec, torch.from_numpy(clip).view(1, 1, -1))
    assert_same_codes_but_near_ties(alone, paired, margins, NEAR_TIE)


def test_streaming_encoder_takes_whole_frames_only(fixture_codec):
    frame_length = fixture_codec.config.frame_length
    encoder = StreamingEncoder(fixture_codec)
    with pytest.raises(ValueError, match="whole frames"):
        encoder.step(torch.zeros(1, 1, frame_length + 1))
    assert encoder.step(torch.zeros(1, 1, 2 * frame_length)).shape == (1, fixture_codec.config.num_codebooks, 2)


# --- dilated convs tuned per shape -------------------------------------------------------------------


@pytest.mark.parametrize("dilation, kernel", [(9, 7), (3, 7), (2, 3)])
def test_im2col_conv_equals_the_convolution(dilation, kernel):
    from engine.model.tuned_conv import conv1d_im2col

    gen = torch.Generator().manual_seed(dilation)
    x = torch.randn(3, 6, 40 + (kernel - 1) * dilation, generator=gen, dtype=torch.float64)
    weight = torch.randn(5, 6, kernel, generator=gen, dtype=torch.float64)
    bias = torch.randn(5, generator=gen, dtype=torch.float64)
    expected = torch.nn.functional.conv1d(x, weight, bias, dilation=dilation)
    assert torch.allclose(conv1d_im2col(x, weight, bias, dilation), expected, rtol=1e-12, atol=1e-12)
    assert torch.allclose(conv1d_im2col(x, weight, None, dilation), expected - bias[:, None], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("part_bytes", [256 << 20, 1])  # one part; then one batch row per part
def test_a_tuned_conv_computes_the_convolution_either_way(part_bytes, monkeypatch):
    from engine.model import tuned_conv

    monkeypatch.setattr(tuned_conv, "IM2COL_BYTES", part_bytes)
    conv = torch.nn.Conv1d(6, 5, 7, dilation=3).double()
    tuned = tuned_conv.ShapeTunedConv1d.like(conv)
    x = torch.randn(3, 6, 58, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for chosen in (False, True):
            tuned.im2col_for[(tuple(x.shape), x.dtype)] = chosen  # as if timing had chosen it
            assert torch.allclose(tuned(x), conv(x), rtol=1e-12, atol=1e-12)
            unbiased = tuned.convolve(x, None)  # the streamed decoder adds the bias in a fused pass
            assert torch.allclose(unbiased + conv.bias[:, None], conv(x), rtol=1e-12, atol=1e-12)


def test_tuned_decoder_convs_share_weights_and_decode_alike(fixture_codec):
    from engine.model.tuned_conv import ShapeTunedConv1d, tune_convs, tuning

    codec = copy.deepcopy(fixture_codec)
    convs = [m for m in codec.decoder.modules() if type(m) is torch.nn.Conv1d]
    taps = [m for m in convs if m.kernel_size[0] > 1]
    tune_convs(codec.decoder)
    tuned = [m for m in codec.decoder.modules() if isinstance(m, ShapeTunedConv1d)]
    assert len(tuned) == len(taps) > 0 and len(taps) < len(convs)  # 1x1 convs are not tuned
    assert any(t.dilation != (1,) for t in tuned) and any(t.dilation == (1,) for t in tuned)
    assert all(t.weight is d.weight and t.dilation == d.dilation for t, d in zip(tuned, taps))
    assert not any(isinstance(m, ShapeTunedConv1d) for m in codec.encoder.modules())
    codes = random_codes(codec.config, 2, 12)
    with torch.inference_mode(), tuning(codec.decoder):  # on the CPU nothing is timed: cuDNN's path
        assert max_diff(decode_chunked(codec, codes, 4), decode_chunked(fixture_codec, codes, 4)) == 0
    assert all(not t.tuning and not t.im2col_for for t in tuned)


@pytest.mark.gpu
def test_tuned_convs_time_each_shape_once_and_match_cudnn():
    from engine.model.tuned_conv import ShapeTunedConv1d, tuning

    conv = torch.nn.Conv1d(384, 384, 7, dilation=9).cuda().to(torch.bfloat16)
    tuned = ShapeTunedConv1d.like(conv)
    shapes = [(64, 384, 4150), (1, 384, 310)]
    with torch.inference_mode():
        for shape in shapes:
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            expected = conv(x).float()
            assert torch.equal(tuned(x), conv(x))  # untimed shapes run cuDNN
            with tuning(tuned):
                got = tuned(x).float()
            assert ((got - expected).norm() / expected.norm()).item() < 1e-2
        assert set(tuned.im2col_for) == {(s, torch.bfloat16) for s in shapes}


@pytest.mark.parametrize("convs_in_tf32", [True, False])
def test_matmuls_standing_in_for_convs_follow_cudnns_tf32_setting(convs_in_tf32):
    """The 1x1 convolutions streamed as matmuls round as cuDNN's convolutions would (TF32 exactly
    when those are), and the process's matmul setting is back afterwards, also after an error."""
    from engine.model.codec_convs import matmuls_round_like_convs

    before = torch.backends.cuda.matmul.allow_tf32
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=convs_in_tf32):
        with matmuls_round_like_convs():
            assert torch.backends.cuda.matmul.allow_tf32 is convs_in_tf32
        with pytest.raises(KeyError), matmuls_round_like_convs():
            raise KeyError("a failing call")
    assert torch.backends.cuda.matmul.allow_tf32 is before
