"""Prefill through CUDA graphs: how rows are grouped into buckets, and that prefilling through the
staging rows writes the keys and values of a plain prefill (on the CPU, each graph replaced by an
eager call of what it captures; on the GPU, captured graphs against the compiled prefill)."""

import pytest
import torch

from engine.compilation import CompilePolicy
from engine.model.dual_ar import TokenLayout
from engine.model.loading import load_dual_ar
from engine.runtime.kv_cache import KVCache
from engine.runtime.prefill_graphs import PrefillRow, plan_groups
from engine.runtime.step_runner import StepRunner
from scheduling import assert_same_kv

ROWS, COLUMNS, MAX_KV = (1, 2, 4), (32, 64, 128, 256), 512


def row(slot, width, start=0):
    return PrefillRow(slot, torch.zeros(11, start + width + 1, dtype=torch.long), start, start + width)


def slots(groups):
    return [[r.slot for r in group] for group in groups]


def test_rows_are_grouped_narrowest_first_up_to_the_largest_row_bucket():
    rows = [row(0, 200), row(1, 10), row(2, 40), row(3, 30), row(4, 100), row(5, 20)]
    groups, left = plan_groups(rows, ROWS, COLUMNS, MAX_KV)
    assert slots(groups) == [[1, 5, 3, 2], [4, 0]] and not left


def test_rows_no_graph_fits_are_left_for_the_compiled_call():
    too_wide, too_late = row(0, 300), row(1, 100, start=400)  # 128 columns from 400 pass MAX_KV
    groups, left = plan_groups([too_wide, row(2, 50), too_late], ROWS, COLUMNS, MAX_KV)
    assert slots(groups) == [[2]] and left == [too_late, too_wide]


def test_a_row_whose_start_would_push_its_group_past_the_kv_buckets_starts_a_new_group():
    # Each fits alone (start 300 + 128 columns <= 512), but the wider row's 256 columns past start 300 do not.
    groups, left = plan_groups([row(0, 100, start=300), row(1, 200)], ROWS, COLUMNS, MAX_KV)
    assert slots(groups) == [[0], [1]] and not left


class EagerGraph:
    """Stands in for a captured CUDA graph on the CPU: a replay calls the captured function again."""

    def __init__(self, fn):
        self.replay = fn

    def pool(self):
        return None


def tiny_model(s1_dir, s1_expected, device):
    ids = s1_expected["special_ids"]
    return load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]), device,
                        torch.float32)


def prefill_alike(graphed, other, rows, prompt_a, prompt_b) -> list[list[int]]:
    """The same prefills through both runners (two slots' first columns alone, then `rows` together);
    asserts equal keys and values for every column written; returns the slots of each graph replay."""
    replays = []
    replay = graphed.prefill_graphs._replay
    graphed.prefill_graphs._replay = lambda group: replays.append([r.slot for r in group]) or replay(group)
    for each in (graphed, other):
        each.prefill(2, prompt_b, 0, 5)
        each.prefill(4, prompt_a, 0, 20)
        each.prefill_many(rows)
    assert_same_kv(graphed.cache, other.cache, rows, 1e-5)
    return replays


def test_prefill_through_staging_rows_writes_the_kv_of_a_plain_prefill(s1_dir, s1_expected, monkeypatch):
    """The staging logic on the CPU (graphs replaced by eager calls of what they capture): rows with
    and without earlier columns in their slot, several groups, a row too long for any graph."""
    from engine.runtime import prefill_graphs

    model = tiny_model(s1_dir, s1_expected, "cpu")
    prompt_a, prompt_b = s1_expected["prompt_a"].long(), s1_expected["prompt_b"].long()
    long_prompt = torch.cat([prompt_b] * 12, dim=1)  # 1,176 columns: wider than any graph's
    rows = [(0, prompt_b, 0), (1, prompt_a, 0), (2, prompt_b, 5), (3, long_prompt, 0), (4, prompt_a, 20),
            (5, prompt_a, 0)]

    def runner():
        c = model.config
        return StepRunner(model, KVCache(c.n_layer, 6, c.n_local_heads, c.max_seq_len, c.head_dim, torch.float32,
                                         "cpu"), CompilePolicy(False, False, "test: eager"))

    staged, plain = runner(), runner()
    monkeypatch.setattr(prefill_graphs, "capture", lambda fn, stream, pool=None, warmup=2: (EagerGraph(fn), None))
    staged.prefill_graphs = prefill_graphs.PrefillGraphs(staged.cache, 6, model.config.num_codebooks + 1)
    staged.prefill_graphs.capture(staged._prefill_graph_call, stream=None)
    staged.prefill_graphs.staging.k.normal_()  # stale values from earlier prefills must not leak in
    staged.prefill_graphs.staging.v.normal_()
    replays = prefill_alike(staged, plain, rows, prompt_a, prompt_b)
    assert replays == [[2], [4], [4, 1, 5, 2], [0]]  # four rows a graph at most; the long row went plain


@pytest.mark.gpu
def test_graphed_prefill_writes_the_kv_of_the_compiled_one(s1_dir, s1_expected):
    """Rows with and without earlier columns in their slot, grouped into graphs of padded columns,
    and a row too long for any graph (the compiled call), against the compiled prefill of each."""
    model = tiny_model(s1_dir, s1_expected, "cuda")
    policy = CompilePolicy(True, True, "test: compiled step in CUDA graphs")
    prompt_a, prompt_b = s1_expected["prompt_a"].long().cuda(), s1_expected["prompt_b"].long().cuda()
    long_prompt = torch.cat([prompt_b] * 12, dim=1)  # 1,176 columns: wider than any graph's
    rows = [(0, prompt_b, 0), (1, prompt_a, 0), (2, prompt_b, 5), (3, long_prompt, 0), (4, prompt_a, 20)]

    def runner(batch_sizes):
        c = model.config
        cache = KVCache(c.n_layer, 5, c.n_local_heads, c.max_seq_len, c.head_dim, torch.float32, "cuda")
        built = StepRunner(model, cache, policy)
        built.prepare(batch_sizes)
        return built

    graphed, compiled = runner([1, 2]), runner([1])
    assert graphed.prefill_graphs is not None and compiled.prefill_graphs is None
    replays = prefill_alike(graphed, compiled, rows, prompt_a, prompt_b)
    assert replays == [[2], [4], [4, 1, 2, 0]]  # the long row took the compiled call


def test_a_failed_prefill_graph_capture_leaves_the_compiled_prefill_and_is_not_retried(s1_dir, s1_expected,
                                                                                      monkeypatch):
    from engine.runtime import prefill_graphs

    model = tiny_model(s1_dir, s1_expected, "cpu")
    c = model.config
    runner = StepRunner(model, KVCache(c.n_layer, 4, c.n_local_heads, c.max_seq_len, c.head_dim, torch.float32,
                                       "cpu"), CompilePolicy(True, True, "test: compiled, graphs"))
    tries = []

    def capture(graphs, forward, stream):
        tries.append(graphs.row_buckets)
        raise RuntimeError("out of memory while capturing")

    monkeypatch.setattr(prefill_graphs.PrefillGraphs, "capture", capture)
    monkeypatch.setattr(runner, "_graph_stream", lambda: None)
    monkeypatch.setattr(runner, "prefill", lambda *args, **kwargs: None)  # the compiles: not under test
    monkeypatch.setattr(runner, "_prefill_rows", lambda rows, block=None: None)
    monkeypatch.setattr(runner, "_capture", lambda batch, kv: runner._graphs.__setitem__((batch, kv), object()))
    runner.prepare([1])
    assert not tries  # batch 1 alone: no prefill graphs yet
    runner.prepare([2])
    runner.prepare([4])
    runner.prepare_prefill()  # the other way in (after a compile helper's prefill): no second try either
    assert tries == [[1, 2, 4]] and runner.prefill_graphs is None and runner.ready_slots == 4
