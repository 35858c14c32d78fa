"""The decoder streamed channels-last (engine/model/channels_last_decoder.py) and its kernels
(engine/model/conv_kernel.py): the PyTorch forms on the CPU against whole decodes, the Triton kernels
on CUDA against the PyTorch forms and against the (B, C, T) streaming path."""

import copy

import pytest
import torch
import torch.nn.functional as F

from engine.model import conv_kernel as ck
from engine.model.channels_last_decoder import ChannelsLastDecoder
from engine.model.codec import load_codec, random_codec
from engine.model.codec_config import CodecConfig
from engine.model.codec_stream import StreamingDecoder, decode_chunked
from engine.runtime.cuda_graphs import capture
from test_codec_stream import FP32_ATOL, max_diff, random_codes, rel_err

T = 60


@pytest.fixture(scope="module")
def fixture_codec(codec_dir):
    return load_codec(codec_dir / "codec.pth", CodecConfig.from_json(codec_dir / "config.json"))


def channels_last(codec, ops=ck.TORCH_OPS):
    streamed = copy.deepcopy(codec)
    streamed.decoder.use_channels_last(ops)
    return streamed


# --- the PyTorch forms ---------------------------------------------------------------------------


def test_taps_compute_the_convolution():
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(2, 40, 12, generator=gen), torch.randn(9, 12, 7, generator=gen), torch.randn(9, generator=gen)
    expected = F.conv1d(x.transpose(1, 2), weight, bias, dilation=3).transpose(1, 2)
    torch.testing.assert_close(ck.conv_taps(x, ck.taps_of(weight), bias, 3), expected)


@pytest.mark.parametrize("stride", [2, 4, 8])
def test_a_transposed_conv_is_a_two_tap_conv_on_the_step_before_and_this_one(stride):
    gen = torch.Generator().manual_seed(stride)
    weight, bias = torch.randn(10, 6, 2 * stride, generator=gen), torch.randn(6, generator=gen)
    x = torch.randn(2, 10, 15, generator=gen)
    expected = F.conv_transpose1d(x, weight, bias, stride)[..., :15 * stride]  # the causal trim
    with_context = torch.cat([torch.zeros(2, 1, 10), x.transpose(1, 2)], 1)  # nothing before the start
    got = ck.conv_taps(with_context, ck.transposed_as_taps(weight), bias.repeat(stride), 1)
    torch.testing.assert_close(got.reshape(2, 15 * stride, 6), expected.transpose(1, 2))


@pytest.mark.parametrize("schedule", [1, 7, [2, 3, 5, 11], T], ids=["ones", "sevens", "primes", "whole"])
def test_channels_last_stream_equals_whole_decode(fixture_codec, schedule):
    codes = random_codes(fixture_codec.config, 2, T, seed=1)
    with torch.inference_mode():
        whole = fixture_codec.decode(codes)
        streamed = decode_chunked(channels_last(fixture_codec), codes, schedule)
    assert max_diff(streamed, whole) <= FP32_ATOL


def test_channels_last_rows_start_apart_reset_and_decode_together(fixture_codec):
    """Rows continued in any subset and order, one reset between utterances: each row's audio is its
    own whole decode, as the engine's codec runner relies on."""
    cfg = fixture_codec.config
    a, b, stale = random_codes(cfg, 1, 30, seed=2), random_codes(cfg, 1, 24, seed=3), random_codes(cfg, 1, 5, seed=4)
    with torch.inference_mode():
        dec = StreamingDecoder(channels_last(fixture_codec), batch=3)
        pieces_a = [dec.decode(a[..., :6], rows=[2])]
        dec.decode(stale, rows=[0])
        dec.reset(rows=[0])
        out = dec.decode(torch.cat([a[..., 6:10], b[..., :4]]), rows=[2, 0])
        pieces_a.append(out[:1])
        pieces_b = [out[1:], dec.decode(b[..., 4:], rows=[0])]
        pieces_a.append(dec.decode(a[..., 10:], rows=[2]))
        assert max_diff(torch.cat(pieces_a, -1), fixture_codec.decode(a)) <= FP32_ATOL
        assert max_diff(torch.cat(pieces_b, -1), fixture_codec.decode(b)) <= FP32_ATOL
        unreset = StreamingDecoder(channels_last(fixture_codec), batch=1)
        unreset.decode(stale)
        assert max_diff(unreset.decode(b), fixture_codec.decode(b)) > 1e-2  # the context is really carried


def test_use_channels_last_streams_through_the_channels_last_decoder(fixture_codec):
    with torch.inference_mode():  # built as the engine builds it; decoded outside inference mode below
        decoder = StreamingDecoder(channels_last(fixture_codec), batch=1)
    assert isinstance(decoder._dec, ChannelsLastDecoder)
    assert not isinstance(StreamingDecoder(fixture_codec)._dec, ChannelsLastDecoder)
    codes = random_codes(fixture_codec.config, 1, 9, seed=6)
    assert max_diff(torch.cat([decoder.decode(codes[..., :4]), decoder.decode(codes[..., 4:])], -1),
                    fixture_codec.decode(codes)) <= FP32_ATOL
    with pytest.raises(ValueError, match="no channels-last operations"):
        copy.deepcopy(fixture_codec).decoder.use_channels_last(None)


def test_set_up_codec_streams_the_decoder_channels_last_with_triton_and_tunes_convs_without(fixture_codec, monkeypatch):
    from engine.compilation import CompilePolicy as Policy
    from engine.model.tuned_conv import ShapeTunedConv1d
    from engine.runtime.codec_runner import set_up_codec

    monkeypatch.setattr(ck, "TRITON_OPS", ck.TORCH_OPS)  # stands in for the kernels on a machine without Triton
    with_triton, without = copy.deepcopy(fixture_codec), copy.deepcopy(fixture_codec)
    set_up_codec(with_triton, Policy(compile=True, cuda_graphs=True, reason="test"))
    set_up_codec(without, Policy(compile=False, cuda_graphs=True, reason="test"))
    assert with_triton.decoder.channels_last is ck.TORCH_OPS
    assert not any(isinstance(m, ShapeTunedConv1d) for m in with_triton.decoder.modules())
    assert without.decoder.channels_last is None
    assert any(isinstance(m, ShapeTunedConv1d) for m in without.decoder.modules())


# --- the Triton kernels --------------------------------------------------------------------------


def triton_ops():
    pytest.importorskip("triton")
    return ck.TRITON_OPS


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", ["by size", "large"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("c_in, c_out, k, dilation", [(96, 96, 7, 9), (192, 384, 2, 1), (6, 1, 7, 1), (24, 12, 1, 1)])
def test_conv_kernel_equals_its_pytorch_form(dtype, c_in, c_out, k, dilation, tiles):
    """Every epilogue, on full-size and odd channel counts; fp32 with TF32 off (IEEE dots). 1,500
    positions take small tiles by size; "large" forces the tiles of full-size calls (fp32's fit the
    shared memory too)."""
    ops = triton_ops()
    chosen = ck.large_tiles(c_in, c_out, dtype.itemsize) if tiles == "large" else None
    gen = torch.Generator(device="cuda").manual_seed(c_in)
    x = torch.randn(3, 500 + (k - 1) * dilation, c_in, device="cuda", generator=gen).to(dtype)
    taps = (torch.randn(k * c_in, c_out, device="cuda", generator=gen) / (k * c_in) ** 0.5).to(dtype)
    bias = torch.randn(c_out, device="cuda", generator=gen).to(dtype)
    alpha = (torch.rand(c_out, device="cuda", generator=gen) + 0.3).to(dtype)
    residual = torch.randn(3, 500, c_out, device="cuda", generator=gen).to(dtype)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for epilogue in (ck.Epilogue(), ck.Epilogue(alpha=alpha, eps=1e-9), ck.Epilogue(residual=residual),
                         ck.Epilogue(tanh=True)):
            got = ops.conv(x, taps, bias, dilation, epilogue, tiles=chosen)
            expected = ck.conv_taps(x, taps, bias, dilation, epilogue)
            tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1.6e-2)
            torch.testing.assert_close(got.float(), expected.float(), **tolerance)
        context, part = x[:, :54].contiguous(), x[:, 54:].contiguous()
        context_alpha = (torch.rand(c_in, device="cuda", generator=gen) + 0.3).to(dtype)
        torch.testing.assert_close(ops.context_snake(context, part, context_alpha, 1e-9).float(),
                                   ck.context_snake_taps(context, part, context_alpha, 1e-9).float(),
                                   rtol=1e-4 if dtype == torch.float32 else 8e-3, atol=1e-4 if dtype == torch.float32 else 8e-3)
    finally:
        torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.gpu
def test_conv_kernel_compiled_ahead_runs_only_after_the_block_and_compiles_no_more():
    """Inside compiling_ahead() a conv only compiles its variant (Triton's post-compile hook fires
    once, when the block ends); the real call after it compiles nothing and computes the conv."""
    from engine.model import compile_ahead

    ops = triton_ops()
    if not compile_ahead.available():
        pytest.skip("this Triton has no AsyncCompileMode")
    import triton

    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 77 + 2 * 5, 40, device="cuda", generator=gen)  # a variant no other test launches
    taps = torch.randn(3 * 40, 24, device="cuda", generator=gen) / 11
    bias, alpha = torch.randn(24, device="cuda", generator=gen), torch.rand(24, device="cuda", generator=gen) + 0.3
    epilogue = ck.Epilogue(alpha=alpha, eps=1e-9)
    compiled = []
    saved_hook = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["fn"].name)
    try:
        with compile_ahead.compiling_ahead(workers=2):
            ops.conv(x, taps, bias, 5, epilogue)
            assert compiled == []  # queued, not finished and not run
        assert compiled == ["_conv_kernel"]
        got = ops.conv(x, taps, bias, 5, epilogue)
        assert compiled == ["_conv_kernel"]
    finally:
        triton.knobs.runtime.jit_post_compile_hook = saved_hook
    torch.testing.assert_close(got, ck.conv_taps(x, taps, bias, 5, epilogue), rtol=5e-3, atol=5e-3)  # TF32 dots


@pytest.mark.gpu
def test_triton_channels_last_stream_equals_whole_decode_in_fp32(fixture_codec):
    ops = triton_ops()
    codec = copy.deepcopy(fixture_codec).cuda()
    codes = random_codes(codec.config, 2, T, seed=5).cuda()
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.inference_mode():
            streamed = decode_chunked(channels_last(codec, ops), codes, [1, 5, 3])
            whole = codec.decode(codes)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert max_diff(streamed, whole) <= FP32_ATOL


@pytest.mark.gpu
@pytest.mark.slow
def test_triton_channels_last_decodes_full_size_audio_like_the_channels_first_path():
    """Full-size random codec in bf16, three streams decoded 16 frames at a time through a CUDA graph,
    as the codec runner does: channels-last kernels and the (B, C, T) path, each against an fp32
    decode. Random weights make bf16 drift far (~0.1 relative, see test_codec_stream); a wrong
    layer gives ~1."""
    ops = triton_ops()
    config = CodecConfig.s1_mini()
    fp32 = random_codec(config, device="cuda")
    first = copy.deepcopy(fp32).decode_in(torch.bfloat16)
    last = channels_last(first, ops)
    codes = random_codes(config, 3, 64, seed=3).cuda()

    def graphed_decode(codec):
        dec = StreamingDecoder(codec, batch=3)
        static = codes[..., :16].clone()
        graph, out = capture(lambda: dec.decode(static), torch.cuda.Stream())
        dec.reset()
        pieces = []
        for t in range(0, 64, 16):
            static.copy_(codes[..., t:t + 16])
            graph.replay()
            pieces.append(out.clone())
        return torch.cat(pieces, -1)

    with torch.inference_mode():
        reference = fp32.decode(codes)
        audio_first, audio_last = graphed_decode(first), graphed_decode(last)
    errors = rel_err(audio_first, reference), rel_err(audio_last, reference), rel_err(audio_last, audio_first)
    assert errors[1] <= 1.3 * errors[0] and errors[2] <= 1.5 * errors[0], errors
