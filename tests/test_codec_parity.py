"""Codec parity with the reference (codec-tiny fixtures), strict loading, config, bf16, random weights."""

import json
import re
import shutil
from contextlib import contextmanager

import pytest
import torch

from engine.errors import CheckpointError
from engine.model.codec import ModdedDAC, load_codec, random_codec
from engine.model.codec_config import CodecConfig

AUDIO_ATOL = 2e-4  # fixtures README: decoded audio
REL_TOL = 1e-4  # fixtures README: intermediate tensors, atol = 1e-4 * max|x|


@pytest.fixture(scope="module")
def config(codec_dir):
    return CodecConfig.from_json(codec_dir / "config.json")


@pytest.fixture(scope="module")
def codec(codec_dir, config):
    return load_codec(codec_dir / "codec.pth", config)


@pytest.fixture(scope="module")
def checkpoint(codec_dir):
    return torch.load(codec_dir / "codec.pth", weights_only=True)


def encode_groups(expected) -> list[int]:
    groups = sorted(int(m[1]) for k in expected if (m := re.fullmatch(r"encode(\d+)_pcm16", k)))
    assert groups, "expected.pt holds no encode{i}_* group"
    return groups


def assert_close_rel(actual, expected, what):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err, scale = (actual - expected).abs().max().item(), expected.abs().max().item()
    assert err <= REL_TOL * scale, f"{what}: max abs error {err:.3g} > {REL_TOL} x max|x| ({scale:.3g})"


def assert_audio_close(actual, expected, what, atol=AUDIO_ATOL):
    assert actual.dtype == torch.float32 and actual.shape == expected.shape, what
    err = (actual - expected).abs().max().item()
    assert err <= atol, f"{what}: max abs error {err:.3g} > {atol}"


@contextmanager
def capture(model, **paths):
    """Record name -> (first input, output) of the submodules at `paths` during the block."""
    seen, handles = {}, []
    for name, path in paths.items():
        hook = lambda m, args, out, name=name: seen.__setitem__(name, (args[0], out))  # noqa: E731
        handles.append(model.get_submodule(path).register_forward_hook(hook))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def pcm_input(expected, i):
    return expected[f"encode{i}_pcm16"].float() / 32768


def test_state_dict_layout_parity(config, checkpoint):
    with torch.device("meta"):
        model = ModdedDAC(config)
    ours = [(k, tuple(v.shape), v.dtype) for k, v in model.state_dict().items()]
    assert ours == [(k, tuple(v.shape), v.dtype) for k, v in checkpoint.items()]


def test_decode_parity(codec, codec_expected):
    codes = codec_expected["decode_codes"]
    hooks = capture(codec, post="quantizer.post_module", up="quantizer.upsample")
    with hooks as seen, torch.inference_mode():
        audio = codec.decode(codes)
    assert audio.shape == (codes.shape[0], 1, codes.shape[-1] * codec.config.frame_length)
    assert_audio_close(audio, codec_expected["decode_audio"], "decode_audio")
    assert_close_rel(seen["post"][0], codec_expected["decode_z_q"], "decode_z_q")
    assert_close_rel(seen["post"][1], codec_expected["decode_post_module_out"], "decode_post_module_out")
    assert_close_rel(seen["up"][1], codec_expected["decode_upsample_out"], "decode_upsample_out")


def test_encode_parity(codec, codec_expected):
    paths = dict(
        encoder_out="encoder", downsample_out="quantizer.downsample", pre_module_out="quantizer.pre_module"
    )
    for i in encode_groups(codec_expected):
        audio = pcm_input(codec_expected, i)
        with capture(codec, **paths) as seen, torch.inference_mode():
            codes = codec.encode(audio)
        for name in paths:
            assert_close_rel(seen[name][1], codec_expected[f"encode{i}_{name}"], f"encode{i}_{name}")
        want, robust = codec_expected[f"encode{i}_codes"], codec_expected[f"encode{i}_codes_robust"]
        n_frames = -(-audio.shape[-1] // codec.config.frame_length)
        assert codes.dtype == torch.int64
        assert codes.shape == want.shape == (audio.shape[0], codec.config.num_codebooks, n_frames)
        differ = (codes != want) & robust
        where = differ.nonzero()[:1].tolist()
        assert not differ.any(), f"encode{i}: {int(differ.sum())} robust codes differ, first at {where}"


def test_roundtrip_parity(codec, codec_expected):
    with torch.inference_mode():
        audio = codec.decode(codec_expected["encode0_codes"])
    assert_audio_close(audio, codec_expected["roundtrip_audio"], "roundtrip_audio")


def test_fused_weight_norm_parity(codec_dir, config, codec, codec_expected):
    unfused = load_codec(codec_dir / "codec.pth", config, for_inference=False)
    assert any(".parametrizations.weight.original0" in k for k in unfused.state_dict())
    assert not any(("parametrizations" in k or "weight_g" in k or "causal_mask" in k) for k in codec.state_dict())
    audio_in = pcm_input(codec_expected, encode_groups(codec_expected)[0])[..., : 4 * config.frame_length]
    with torch.inference_mode():
        a, b = unfused.decode(codec_expected["decode_codes"]), codec.decode(codec_expected["decode_codes"])
        assert torch.equal(unfused.encode(audio_in), codec.encode(audio_in))
    assert_audio_close(a, b, "fused vs unfused decode", atol=1e-6)


def test_decode_clamps_codes_parity(codec, codec_expected):
    codes = codec_expected["decode_codes"].clone()
    big = codes.clone()
    big[:, 0, 0] = codec.config.semantic_codebook_size + 7
    big[:, 1:, 0] = codec.config.residual_codebook_size + 7
    codes[:, 0, 0] = codec.config.semantic_codebook_size - 1
    codes[:, 1:, 0] = codec.config.residual_codebook_size - 1
    with torch.inference_mode():
        assert torch.equal(codec.decode(big), codec.decode(codes))


def test_bf16_decode_close_to_fp32(codec_dir, config, codec_expected):
    # Information-only bound: the fixtures measured ~0.16 max abs for bf16 autocast vs fp32.
    model = load_codec(codec_dir / "codec.pth", config).to(torch.bfloat16)
    with torch.inference_mode():
        audio = model.decode(codec_expected["decode_codes"])
    ref = codec_expected["decode_audio"]
    assert audio.dtype == torch.float32 and audio.shape == ref.shape
    assert (audio - ref).abs().max() < 0.5
    assert (audio - ref).norm() < 0.25 * ref.norm()


def test_too_many_frames_is_a_clear_error(codec, codec_expected):
    limit = codec.config.quantizer_transformer.block_size
    codes = codec_expected["decode_codes"][..., :1].repeat(1, 1, limit + 1)
    with pytest.raises(ValueError, match=f"at most {limit}"), torch.inference_mode():
        codec.decode(codes)


# --- loading ------------------------------------------------------------------------------------


def save(tmp_path, state, name="codec.pth"):
    path = tmp_path / name
    torch.save(state, path)
    return path


def test_load_rejects_missing_key(tmp_path, config, checkpoint):
    key = "quantizer.post_module.norm.weight"
    state = {k: v for k, v in checkpoint.items() if k != key}
    with pytest.raises(CheckpointError, match=re.escape(f"1 missing: {key}")):
        load_codec(save(tmp_path, state), config)


def test_load_rejects_unexpected_key(tmp_path, config, checkpoint):
    key = "decoder.transformer.layers.0.attention.wqkv.weight"
    with pytest.raises(CheckpointError, match=re.escape(f"1 unexpected: {key}")):
        load_codec(save(tmp_path, {**checkpoint, key: torch.zeros(3)}), config)


def test_load_rejects_wrong_shape(tmp_path, config, checkpoint):
    key = "quantizer.semantic_quantizer.quantizers.0.codebook.weight"
    state = {**checkpoint, key: checkpoint[key][:-1]}
    with pytest.raises(CheckpointError, match=re.escape(f"{key} has shape")):
        load_codec(save(tmp_path, state), config)


def test_load_wrong_config_names_the_config(checkpoint, codec_dir):
    with pytest.raises(CheckpointError, match="built-in S1-mini config"):
        load_codec(codec_dir / "codec.pth")  # no codec_config.json there: the full-size config


def test_load_missing_file(tmp_path, config):
    with pytest.raises(CheckpointError, match="not found"):
        load_codec(tmp_path / "codec.pth", config)


def test_load_unwraps_training_checkpoint(tmp_path, config, checkpoint, codec):
    state = {f"generator.{k}": v for k, v in checkpoint.items()}
    state["discriminator.conv.weight"] = torch.zeros(2)
    model = load_codec(save(tmp_path, {"state_dict": state}), config)
    ours, ref = model.state_dict(), codec.state_dict()
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)


def test_load_finds_codec_config_json_beside_checkpoint(tmp_path, codec_dir, config):
    shutil.copy(codec_dir / "codec.pth", tmp_path / "codec.pth")
    shutil.copy(codec_dir / "config.json", tmp_path / "codec_config.json")
    assert load_codec(tmp_path / "codec.pth").config == config


# --- config -------------------------------------------------------------------------------------


def test_config_json_roundtrip(codec_dir, config):
    raw = json.loads((codec_dir / "config.json").read_text())
    assert config.to_dict() == {k: v for k, v in raw.items() if not k.endswith("_note")}
    assert config.frame_length == config.hop_length * 4
    assert config.num_codebooks == 1 + config.n_residual_codebooks


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("latent_dim"), r"missing keys \['latent_dim'\]"),
        (lambda d: d.update(latnet_dim=1), r"unknown keys \['latnet_dim'\]"),
        # Each change derived from the fixture's own values, so any codec config of this layout breaks.
        (lambda d: d.update(encoder_rates=[*d["encoder_rates"][:-1], 2 * d["encoder_rates"][-1]]), "hop_length"),
        (lambda d: d.update(decoder_rates=d["decoder_rates"][:-1]), "decoder_block_dims"),
        (lambda d: d.update(codebook_dim="8"), "codebook_dim = '8' is not of type int"),
        (lambda d: d["quantizer_transformer"].update(n_head=d["quantizer_transformer"]["n_head"] + 1),
         "n_head x head_dim"),
        (lambda d: d["encoder_transformer"].pop("block_size"), r"transformer: missing keys \['block_size'\]"),
        (lambda d: d.update(num_codebooks_total=d["n_residual_codebooks"] + 2), "num_codebooks_total"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, codec_dir, change, message):
    raw = json.loads((codec_dir / "config.json").read_text())
    change(raw)
    path = tmp_path / "codec_config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=message):
        CodecConfig.from_json(path)


# --- random weights (demo mode) -----------------------------------------------------------------


def test_random_codec_is_audible_and_deterministic(codec_dir):
    config = CodecConfig.from_json(codec_dir / "config.json")
    sizes = [config.semantic_codebook_size] + [config.residual_codebook_size] * config.n_residual_codebooks
    gen = torch.Generator().manual_seed(1)
    codes = torch.stack([torch.randint(0, n, (1, 24), generator=gen) for n in sizes], dim=1)
    model = random_codec(config, seed=0)
    with torch.inference_mode():
        audio = model.decode(codes)
        again = random_codec(config, seed=0).decode(codes)
        other = random_codec(config, seed=1).decode(codes)
        encoded = model.encode(audio[:, :, :-100])
    assert audio.shape == (1, 1, codes.shape[-1] * config.frame_length)
    assert 0.05 < audio.std() < 0.6, "silent or saturated"
    assert (audio.abs() > 0.99).float().mean() < 1e-3, "saturated"
    assert torch.equal(audio, again) and not torch.equal(audio, other)
    assert encoded.shape == codes.shape
