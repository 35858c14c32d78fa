"""The full-size codec built from CodecConfig.s1_mini() has exactly the released codec.pth layout."""

import json

import pytest
import torch

from engine.model.codec import ModdedDAC
from engine.model.codec_config import CodecConfig


@pytest.fixture(scope="module")
def manifest(fixtures_dir):
    return json.loads((fixtures_dir / "manifests" / "codec_pth_keys.json").read_text())


@pytest.fixture(scope="module")
def full_size():
    with torch.device("meta"):  # shapes only: no 1.9 GB allocation
        return ModdedDAC(CodecConfig.s1_mini())


def test_state_dict_matches_manifest(full_size, manifest):
    state = full_size.state_dict()
    ours = [(k, list(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]
    theirs = [(t["key"], t["shape"], t["dtype"]) for t in manifest["tensors"]]
    assert sorted(ours) == sorted(theirs), "keys, shapes or dtypes differ"
    assert ours == theirs, "same tensors, different order"


def test_parameters_and_buffers_match_manifest(full_size, manifest):
    kinds = {t["key"]: t["kind"] for t in manifest["tensors"]}
    assert {k: "parameter" for k, _ in full_size.named_parameters()} == {
        k: v for k, v in kinds.items() if v == "parameter"
    }
    totals = manifest["totals"]
    params, buffers = list(full_size.parameters()), list(full_size.buffers())
    assert len(params) == totals["parameter_tensors"] and len(buffers) == totals["buffer_tensors"]
    assert sum(p.numel() for p in params) == totals["parameters"]
    assert sum(p.numel() * p.element_size() for p in params) == totals["parameter_bytes"]
    assert sum(b.numel() * b.element_size() for b in buffers) == totals["buffer_bytes"]


def test_s1_mini_config_numbers():
    c = CodecConfig.s1_mini()
    assert (c.sample_rate, c.frame_length, c.num_codebooks) == (44100, 2048, 10)
    assert (c.semantic_codebook_size, c.residual_codebook_size) == (4096, 1024)
    assert CodecConfig.from_dict(c.to_dict()) == c
