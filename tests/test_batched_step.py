"""The batched decode step: a sequence gets the same frames alone or beside others (CPU, eager).

This is the property continuous batching stands on: rows never see each other's KV, sampling
parameters or noise, whatever their prompt lengths and positions."""

import copy

import pytest
import torch

from engine.compilation import CompilePolicy
from engine.model.dual_ar import TokenLayout, call_block
from engine.model.loading import load_dual_ar
from engine.runtime.decode_step import DecodeState
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


def test_prefilling_rows_together_writes_the_kv_each_row_gets_alone(s1_dir, s1_expected, monkeypatch):
    from engine.runtime import step_runner

    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                         "cpu", torch.float32)
    prompt_a, prompt_b = s1_expected["prompt_a"].long(), s1_expected["prompt_b"].long()
    # Slots 0-2: one call (prompts of different lengths, slot 2's starting after 5 columns already
    # in place); slot 3 would pass the column limit of three of the longest rows, and slot 5 is
    # not next to it: each goes alone.
    monkeypatch.setattr(step_runner, "PREFILL_COLUMNS", 3 * (prompt_b.shape[1] - 1))
    rows = [(5, prompt_a, 0), (0, prompt_b, 0), (1, prompt_a, 0), (2, prompt_b, 5), (3, prompt_a, 0)]
    together, alone = runner_for(model, 6), runner_for(model, 6)
    for runner in (together, alone):  # the columns before slot 2's start, as a voice prefix would be
        runner.prefill(2, prompt_b, 0, 5)
    calls = []
    prefill_rows = together._prefill_rows
    monkeypatch.setattr(together, "_prefill_rows", lambda group: calls.append([r[0] for r in group]) or prefill_rows(group))
    together.prefill_many(rows)
    for slot, prompt, start in rows:
        alone.prefill(slot, prompt, start)
    assert calls == [[0, 1, 2]]
    for slot, prompt, _ in rows:
        written = prompt.shape[1] - 1
        torch.testing.assert_close(together.cache.k[:, slot, :, :written], alone.cache.k[:, slot, :, :written],
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(together.cache.v[:, slot, :, :written], alone.cache.v[:, slot, :, :written],
                                   atol=1e-5, rtol=0)


def test_rows_whose_padded_columns_would_pass_the_cache_end_are_prefilled_apart(s1_dir, s1_expected):
    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                         "cpu", torch.float32)
    prompt_a, prompt_b = s1_expected["prompt_a"].long(), s1_expected["prompt_b"].long()
    runner = runner_for(model, 3)
    width = prompt_b.shape[1] - 1
    runner.cache.capacity = width + 4  # slot 1's text starts at 5: padded to slot 0's width it would end at width + 5
    rows = [(0, prompt_b, 0), (1, prompt_a, 5), (2, prompt_a, 0)]
    assert runner._prefill_groups(rows) == [[rows[0]], [rows[1], rows[2]]]


def test_the_step_sampler_units_trace_whole_and_equal_their_plain_calls(s1_dir, s1_expected):
    """The compiled step compiles sample_first_code and sample_and_embed as regions of their own
    (fullgraph, the head object an argument): traced, they give the plain call's ids and inputs."""
    from engine.runtime.frame_sampler import FullVocabHead, SemanticHead, sample_and_embed, sample_first_code
    from engine.runtime.sampling import SamplingTensors

    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                         "cpu", torch.float32)
    gen = torch.Generator().manual_seed(0)
    batch, window = 3, 16
    params = SamplingTensors.build([0.7, 1.0, 0.9], [0.8, 0.95, 0.7], [1.2, 1.0, 1.1], [5, 6, 7], "cpu")
    valid = torch.arange(window) < torch.tensor([[0], [5], [16]])
    counter = torch.tensor([0, 64, 128])
    table = model.fast_embeddings.weight
    for head in (SemanticHead(model), FullVocabHead(model)):
        hidden = torch.randn(batch, 1, model.config.dim, generator=gen)
        logits = head.logits(hidden)
        history = head.token_of(torch.randint(0, logits.shape[-1], (batch, window), generator=gen))
        history[0, 0] = ids["im_end"]  # a token without a code
        traced = torch.compile(sample_first_code, fullgraph=True, backend="aot_eager")
        for got, expected in zip(traced(head, logits, params, history, valid, counter, table),
                                 sample_first_code(head, logits, params, history, valid, counter, table), strict=True):
            assert torch.equal(got, expected)
    fast_logits = torch.randn(batch, table.shape[0], generator=gen)
    history = torch.randint(0, table.shape[0], (batch, window), generator=gen)
    traced = torch.compile(sample_and_embed, fullgraph=True, backend="aot_eager")
    for got, expected in zip(traced(fast_logits, params, history, valid, counter, table),
                             sample_and_embed(fast_logits, params, history, valid, counter, table), strict=True):
        assert torch.equal(got, expected)


def test_the_step_embedding_and_bookkeeping_units_trace_whole_and_equal_their_plain_calls(s1_dir, s1_expected):
    """The compiled step compiles embed_and_rotation, sampling_inputs and record_frame as regions of
    their own (fullgraph): traced, they give the plain call's values and leave the decode state as
    it does, idle rows and a row ending on <|im_end|> included."""
    from engine.model.dual_ar import embed_and_rotation
    from engine.runtime.decode_step import record_frame
    from engine.runtime.frame_sampler import sampling_inputs

    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                         "cpu", torch.float32)
    n_codebooks, batch = model.config.num_codebooks, 3
    gen = torch.Generator().manual_seed(0)
    columns = torch.randint(0, model.config.codebook_size, (batch, n_codebooks + 1, 1), generator=gen)
    columns[:, 0] = torch.tensor([[ids["semantic_begin"] + 5], [ids["im_end"]], [ids["semantic_end"]]])
    positions = torch.tensor([[3], [40], [7]])
    traced = torch.compile(embed_and_rotation, fullgraph=True, backend="aot_eager")
    for got, expected in zip(traced(model, columns, positions), embed_and_rotation(model, columns, positions),
                             strict=True):
        assert torch.equal(got, expected)

    state = DecodeState.allocate(batch, n_codebooks, 32, "cpu")
    for slot in (0, 1):  # slot 2 stays idle
        state.start(slot, columns[slot, :, 0], 10 + slot, 0.7, 0.8, 1.1, slot)
    state.history.generated[1] = 20  # past the history window: its entries wrap around
    traced_inputs = torch.compile(sampling_inputs, fullgraph=True, backend="aot_eager")
    for got, expected in zip(traced_inputs(state.history, n_codebooks), sampling_inputs(state.history, n_codebooks),
                             strict=True):
        assert torch.equal(got, expected)
    expected_state = copy.deepcopy(state)
    frame = torch.randint(0, model.config.codebook_size, (batch, n_codebooks + 1), generator=gen)
    frame[1, 0] = ids["im_end"]
    torch.compile(record_frame, fullgraph=True, backend="aot_eager")(state, frame, ids["im_end"])
    record_frame(expected_state, frame, ids["im_end"])
    for name in ("columns", "positions", "frames", "done", "length", "active"):
        assert torch.equal(getattr(state, name), getattr(expected_state, name)), name
    assert torch.equal(state.history.ids, expected_state.history.ids)
    assert torch.equal(state.history.generated, expected_state.history.generated)
    assert state.done.tolist() == [False, True, False] and state.positions.tolist() == [11, 12, 0]


def test_starting_rows_together_sets_each_row_and_no_other():
    state = DecodeState.allocate(4, 2, 8, "cpu")
    for tensor in (state.columns, state.positions, state.history.ids, state.history.generated, state.frames,
                   state.length, state.active, state.sampling.noise_key):
        tensor.fill_(7)
    for tensor in (state.sampling.temperature, state.sampling.top_p, state.sampling.repetition_penalty):
        tensor.fill_(9.5)
    state.done.fill_(True)
    before = copy.deepcopy(state)
    state.start_many([(3, torch.tensor([1, 2, 3]), 40, 0.7, 0.8, 1.1, 123), (1, torch.tensor([4, 5, 6]), 12, 0.5, 0.9, 1.3, 5)])
    assert state.columns[[3, 1]].tolist() == [[1, 2, 3], [4, 5, 6]] and state.positions[[3, 1]].tolist() == [40, 12]
    s = state.sampling
    assert s.temperature[[3, 1], 0].tolist() == pytest.approx([0.7, 0.5])
    assert s.top_p[[3, 1], 0].tolist() == pytest.approx([0.8, 0.9])
    assert s.repetition_penalty[[3, 1], 0].tolist() == pytest.approx([1.1, 1.3])
    assert s.noise_key[[3, 1]].tolist() == [123, 5]
    assert not state.history.ids[[3, 1]].any() and state.history.generated[[3, 1]].tolist() == [0, 0]
    assert state.done[[3, 1]].tolist() == [False, False] and state.length[[3, 1]].tolist() == [0, 0]
    assert state.active[[3, 1]].tolist() == [1, 1]
    for name in ("columns", "positions", "frames", "done", "length", "active"):
        for slot in (0, 2):
            assert torch.equal(getattr(state, name)[slot], getattr(before, name)[slot]), name
    assert torch.equal(state.frames, before.frames)  # a new sequence's frames overwrite the old ones as it runs


def test_a_failed_batched_prefill_compile_leaves_rows_admitted_together_eager_and_captures_on(
        s1_dir, s1_expected, monkeypatch):
    """prepare() compiles the prefill of rows admitted together with the first batch above one; if
    that fails, the batch graphs are still captured, the eager call stays, and it is not retried."""
    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]),
                         "cpu", torch.float32)
    c = model.config
    runner = StepRunner(model, KVCache(c.n_layer, 4, c.n_local_heads, c.max_seq_len, c.head_dim, torch.float32,
                                       "cpu"), CompilePolicy(True, True, "test: compiled, graphs"))
    compiles, captured = [], []
    monkeypatch.setattr(runner, "prefill", lambda *args, **kwargs: None)  # the lone-row compile: not under test

    def prefill_rows(rows, block=None):
        compiles.append(block is not None and block is not call_block)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(runner, "_prefill_rows", prefill_rows)
    monkeypatch.setattr(runner, "_capture", lambda batch, kv: captured.append(batch) or
                        runner._graphs.__setitem__((batch, kv), object()))
    runner.prepare([1, 2])
    runner.prepare([4])
    assert compiles == [True]  # tried once, with the first batch above one
    assert runner.batched_prefill_block is call_block
    assert runner.ready_slots == 4 and set(captured) == {1, 2, 4}
