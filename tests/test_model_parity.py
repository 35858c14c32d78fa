"""DualAR transformer against the reference's golden numbers (fp32, tiny checkpoint).

Tolerances from the fixtures README: logits and hidden states atol 1e-4; integers exact.
"""

import pytest
import torch

from engine.model.dual_ar import TokenLayout, one_query_attention, rope_table
from engine.model.loading import load_dual_ar
from reference_generation import generate, new_fast_cache
from engine.runtime.kv_cache import KVCache
from engine.runtime.sampling import SamplingTensors

ATOL = 1e-4


@pytest.fixture(scope="module")
def model(s1_dir, s1_expected):
    ids = s1_expected["special_ids"]
    layout = TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"])
    return load_dual_ar(s1_dir, layout, "cpu", torch.float32)


def new_cache(model, capacity=None):
    c = model.config
    return KVCache(c.n_layer, 1, c.n_local_heads, capacity or c.max_seq_len, c.head_dim, torch.float32, "cpu")


def prefill_all(model, sequence):
    """Residual stream after the last slow layer at every position of one cached prefill."""
    length = sequence.shape[1]
    views = new_cache(model).views(torch.arange(length)[None], length)
    with torch.inference_mode():
        return model.forward_slow(sequence[None].long(), views)[0]


def test_rope_tables_parity(model, s1_expected):
    slow = s1_expected["rope_slow_table_first256"]
    fast = s1_expected["rope_fast_table"]
    assert torch.equal(model.rope_slow[: slow.shape[0]].float(), slow)
    assert torch.equal(model.rope_fast.float(), fast)
    assert torch.equal(rope_table(fast.shape[0], 2 * fast.shape[1], model.config.rope_base).float(), fast)


def test_slow_layers_parity(model, s1_expected):
    sequence = s1_expected["fwd_sequence"].long()
    expected = s1_expected["fwd_slow_layer_io"]
    outputs = []
    hooks = [layer.register_forward_hook(lambda _m, _i, out: outputs.append(out[0])) for layer in model.layers]
    try:
        prefill_all(model, sequence)
    finally:
        for hook in hooks:
            hook.remove()
    with torch.inference_mode():
        embedded = model.embed(sequence[None])[0]
    torch.testing.assert_close(embedded, expected[0], atol=ATOL, rtol=0)
    assert len(outputs) == expected.shape[0] - 1
    for i, out in enumerate(outputs, start=1):
        torch.testing.assert_close(out, expected[i], atol=ATOL, rtol=0, msg=f"slow layer {i - 1}")


def test_slow_logits_and_hidden_parity(model, s1_expected):
    hidden = prefill_all(model, s1_expected["fwd_sequence"])
    positions = s1_expected["fwd_positions"]
    torch.testing.assert_close(hidden[positions], s1_expected["fwd_hidden"], atol=ATOL, rtol=0)
    with torch.inference_mode():
        logits = model.slow_logits(hidden[positions])
    torch.testing.assert_close(logits, s1_expected["fwd_slow_logits"], atol=ATOL, rtol=0)


def assert_decode_matches_prefill(model, s1_expected, steps=None, run_block=None):
    """Prefill the prompt, then write the cache one position at a time (through run_block): every
    step's state equals the one prefill of the whole sequence gives."""
    sequence = s1_expected["fwd_sequence"].long()
    full = prefill_all(model, sequence)
    prompt_len = s1_expected["prompt_b"].shape[1]
    cache = new_cache(model)
    end = sequence.shape[1] if steps is None else prompt_len + steps
    with torch.inference_mode():
        model.forward_slow(sequence[None, :, :prompt_len], cache.views(torch.arange(prompt_len)[None], prompt_len))
        for pos in range(prompt_len, end):
            step = model.forward_slow(sequence[None, :, pos: pos + 1], cache.views(torch.tensor([[pos]]), pos + 1),
                                      run_block)
            torch.testing.assert_close(step[0, 0], full[pos], atol=ATOL, rtol=0)


def test_incremental_decode_matches_prefill(model, s1_expected):
    """Writing the cache one position at a time gives the same states as one prefill."""
    assert_decode_matches_prefill(model, s1_expected)


def test_fast_logits_parity(model, s1_expected):
    hidden = prefill_all(model, s1_expected["fwd_sequence"])
    positions = s1_expected["fwd_positions"]
    frames = s1_expected["fwd_frames"].long()
    expected = s1_expected["fwd_fast_logits"]
    n_cases, n_codebooks = expected.shape[:2]
    fast_cache = new_fast_cache(model, 1)
    for j in range(n_cases):
        x = hidden[positions[j]].view(1, 1, -1)
        for k in range(n_codebooks):
            if k > 0:
                x = model.fast_embeddings(frames[k, j].view(1)).unsqueeze(1)  # row k holds c_{k-1}
            with torch.inference_mode():
                logits = model.forward_fast(x, fast_cache.views(torch.tensor([[k]]), k + 1))
            torch.testing.assert_close(logits[0, 0], expected[j, k], atol=ATOL, rtol=0, msg=f"case {j} pos {k}")
    short = s1_expected["fwd_fast_logits_short"]
    assert torch.equal(expected[:, 1:, : short.shape[-1]], short)


def test_a_fast_position_without_logits_stores_the_keys_and_values_of_a_full_one(model, s1_expected):
    """Position 0 only fills the fast cache (n_logits=0): its last layer stores its keys and values
    and skips the rest, and every layer's cache equals that of the whole call."""
    hidden = prefill_all(model, s1_expected["fwd_sequence"])
    x = hidden[s1_expected["fwd_positions"][0]].view(1, 1, -1)
    caches = [new_fast_cache(model, 1) for _ in range(2)]
    with torch.inference_mode():
        assert model.forward_fast(x, caches[0].views(torch.tensor([[0]]), 1), n_logits=0) is None
        model.forward_fast(x, caches[1].views(torch.tensor([[0]]), 1))
    assert caches[0].k[:, :, :, 0].abs().sum(-1).gt(0).all()  # every layer and head wrote position 0
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)


@pytest.mark.parametrize("name", ["a", "b"])
def test_greedy_generation_parity(model, s1_expected, name):
    """The reference's greedy settings: top_p 1e-6 keeps only the best id; temperature 1; penalty off."""
    expected_tokens = s1_expected[f"gen_{name}_tokens"]
    greedy = SamplingTensors.build([1.0], [1e-6], [1.0], [1234], "cpu")
    result = generate(model, s1_expected[f"prompt_{name}"], greedy,
                      max_new_tokens=_max_new_tokens(s1_expected, name), cache=new_cache(model))
    assert torch.equal(result.tokens, expected_tokens)
    assert torch.equal(result.codes, s1_expected[f"gen_{name}_codes"])
    assert result.stopped_on_im_end == s1_expected[f"gen_{name}_stopped_on_im_end"]


def _max_new_tokens(expected, name):
    """The fixtures' budget: a run that did not stop used all of it; one that stopped had at least as much."""
    generated = expected[f"gen_{name}_tokens"].shape[1]
    others = [expected[f"gen_{n}_tokens"].shape[1] for n in "ab" if not expected[f"gen_{n}_stopped_on_im_end"]]
    return max(others) if others else generated


def test_fused_inference_layout_gives_the_same_logits(s1_dir, s1_expected):
    """fuse_() (one gate/up matmul) keeps the state dict and the numbers."""
    ids = s1_expected["special_ids"]
    layout = TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"])
    fused = load_dual_ar(s1_dir, layout, "cpu", torch.float32).fuse_()
    plain = load_dual_ar(s1_dir, layout, "cpu", torch.float32)
    assert fused.state_dict().keys() == plain.state_dict().keys()
    hidden = prefill_all(fused, s1_expected["fwd_sequence"])
    torch.testing.assert_close(hidden, prefill_all(plain, s1_expected["fwd_sequence"]), atol=ATOL, rtol=0)
    positions = s1_expected["fwd_positions"]
    torch.testing.assert_close(hidden[positions], s1_expected["fwd_hidden"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("masked", [True, False])
def test_one_query_attention_equals_sdpa(masked):
    """The decode attention the compiled step uses, against the general kernel the eager path uses."""
    gen = torch.Generator().manual_seed(0)
    q, keys, values = (torch.randn(shape, generator=gen) for shape in ((3, 8, 2, 128), (3, 8, 300, 128), (3, 8, 300, 128)))
    positions = torch.tensor([0, 150, 299])
    mask = (torch.arange(300) <= positions[:, None, None, None]).expand(3, 1, 2, 300) if masked else None
    expected = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    torch.testing.assert_close(one_query_attention(q, keys, values, mask), expected, rtol=1e-5, atol=1e-5)


def test_compiled_decode_attends_with_the_written_out_attention_and_matches_prefill(model, s1_expected):
    """Under torch.compile a one-position step takes one_query_attention (no SDPA in its graphs) and
    gives the prefill's states (graphs recorded, not lowered: this checks the dispatch and maths)."""
    graphs = []
    torch._dynamo.reset()
    block = torch.compile(lambda layer, x, rope, kv: layer(x, rope, kv), fullgraph=True,
                          backend=lambda gm, _: graphs.append(gm) or gm)
    assert_decode_matches_prefill(model, s1_expected, steps=3, run_block=block)
    targets = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert graphs and not any("scaled_dot_product" in t for t in targets)
