"""The full-size model built on the meta device has exactly the released model.pth layout."""

import json

import torch

from engine.model.dual_ar import DualARTransformer, TokenLayout
from engine.model.dual_ar_config import DualARConfig


def test_full_size_model_matches_manifest(fixtures_dir):
    manifest = json.loads((fixtures_dir / "manifests" / "model_pth_keys.json").read_text())
    config = DualARConfig.from_dict(manifest["config"])
    with torch.device("meta"):
        model = DualARTransformer(config, TokenLayout(151658, 155753, 151647)).to(torch.bfloat16)
    state = model.state_dict()
    expected = [(t["key"], t["shape"], t["dtype"]) for t in manifest["tensors"]]
    actual = [(k, list(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]
    assert actual == expected
    assert sum(v.numel() for v in state.values()) == manifest["totals"]["parameters"]
