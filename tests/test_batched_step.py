"""The batched decode step: a sequence gets the same frames alone or beside others (CPU, eager).

This is the property continuous batching stands on: rows never see each other's KV, sampling
parameters or noise, whatever their prompt lengths and positions."""

import torch

from engine.compilation import CompilePolicy
from engine.model.dual_ar import TokenLayout
from engine.model.loading import load_dual_ar
from engine.runtime.kv_cache import KVCache
from engine.runtime.step_runner import StepRunner

EAGER = CompilePolicy(False, False, "test")


def runner_for(model, slots):
    c = model.config
    return StepRunner(model, KVCache(c.n_layer, slots, c.n_local_heads, c.max_seq_len, c.head_dim,
                                     torch.float32, "cpu"), EAGER)


def decode(runner, requests, frames):
    """requests: (slot, prompt, temperature, top_p, penalty, seed); returns each slot's frames."""
    for slot, prompt, t, top_p, rp, seed in requests:
        runner.prefill(slot, prompt)
        runner.state.start(slot, prompt[:, -1], prompt.shape[1] - 1, t, top_p, rp, seed)
    batch = max(r[0] for r in requests) + 1
    longest = max(r[1].shape[1] for r in requests)
    for i in range(frames):
        runner.step(batch, longest + i)
    return {slot: runner.state.frames[slot, :, :frames].clone() for slot, *_ in requests}


def test_a_sequence_decodes_the_same_alone_or_in_a_batch(s1_dir, s1_expected):
    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                         "cpu", torch.float32)
    prompt_a, prompt_b = s1_expected["prompt_a"].long(), s1_expected["prompt_b"].long()
    requests = [
        (0, prompt_b, 0.8, 0.8, 1.2, 11),
        (1, prompt_a, 0.7, 0.9, 1.0, 22),  # a shorter prompt: different positions in the same step
        (2, prompt_b, 0.8, 0.8, 1.2, 33),  # same prompt and settings as slot 0, another seed
    ]
    together = decode(runner_for(model, 3), requests, frames=20)
    for slot, prompt, t, top_p, rp, seed in requests:
        alone = decode(runner_for(model, 1), [(0, prompt, t, top_p, rp, seed)], frames=20)[0]
        assert torch.equal(together[slot], alone), f"slot {slot}"
    assert not torch.equal(together[0], together[2])  # the seed matters
