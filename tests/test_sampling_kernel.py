"""The one-kernel sampler of the compiled step against the plain `sampling.sample` (CUDA with Triton only)."""

import pytest
import torch

from engine.runtime.sampling import SamplingTensors, sample

pytestmark = pytest.mark.gpu
kernel = None  # engine.runtime.sampling_kernel, imported once a test runs: it needs Triton, which a CPU machine may lack


@pytest.fixture(scope="module", autouse=True)
def triton_module():
    global kernel
    kernel = pytest.importorskip("engine.runtime.sampling_kernel", reason="needs Triton")

WINDOW = 16


def _inputs(rows: int, width: int, seed: int):
    """Logits with many exact ties (bf16, and whole numbers in some rows), histories, and per-row
    parameters covering top_p 0 and 1, no penalty, and temperatures from 0 (clamped) to 1.5. The
    history and the counters are strided views, as the step passes one codebook's of several."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, width, generator=gen) * 3).bfloat16()
    logits[: rows // 8] = torch.randn(rows // 8, width, generator=gen).round().bfloat16()
    history = torch.randint(0, width, (rows, 3, WINDOW), generator=gen).cuda()[:, 1]
    valid = torch.rand(rows, WINDOW, generator=gen) < 0.7
    top_p = torch.rand(rows, generator=gen)
    top_p[:4], top_p[4:8] = 1.0, 0.0
    temperature = torch.rand(rows, generator=gen) * 1.5
    temperature[12:16] = 0.0
    penalty = 1 + torch.rand(rows, generator=gen)
    penalty[8:12] = 1.0
    keys = torch.randint(0, 2**40, (rows,), generator=gen)
    params = SamplingTensors.build(temperature.tolist(), top_p.tolist(), penalty.tolist(), keys.tolist(), "cuda")
    counter = torch.randint(0, 2**30, (rows, 4), generator=gen).cuda()[:, 2]
    return logits.cuda(), history, valid.cuda(), params, counter


def _run(logits, history, valid, params, counter, embeddings, id_begin, n_ids, extra_id):
    return kernel.sample_rows(logits, history, valid, params.temperature, params.top_p, params.repetition_penalty,
                              params.noise_key, counter, embeddings, id_begin, n_ids, extra_id)


@pytest.mark.parametrize("rows,width", [(256, 1024), (256, 4097), (64, 24), (1, 1024)])
def test_the_kernel_samples_the_ids_of_the_plain_sampler(rows, width):
    logits, history, valid, params, counter = _inputs(rows, width, seed=width + rows)
    embeddings = torch.randn(width, 64, device="cuda").bfloat16()
    ids, codes, embedded = _run(logits, history, valid, params, counter, embeddings, 0, width, -1)
    expected = sample(logits, params, history, valid, counter)
    assert torch.equal(ids, expected)
    assert torch.equal(codes, expected)
    assert torch.equal(embedded, embeddings[expected])
    if rows > 1:  # the comparison is sensitive: without the nucleus and penalty other ids win
        loose = SamplingTensors(params.temperature, torch.ones_like(params.top_p),
                                torch.ones_like(params.repetition_penalty), params.noise_key)
        assert not torch.equal(sample(logits, loose, history, valid, counter), expected)


def test_codebook_zero_ids_map_to_tokens_and_back():
    """Index i < n_ids is token id_begin + i, index n_ids is extra_id (<|im_end|>); the history
    holds tokens, and ids of neither kind are never penalised: as SemanticHead and sample_first_code.
    Rows 16-47 favour <|im_end|> and hold it in their history (its penalty decides), rows 48-63 favour
    it and hold the id just past the semantic ones, which must not penalise it."""
    rows, width, begin, extra = 128, 4097, 151_000, 150_000
    n_ids = width - 1
    logits, _, valid, params, counter = _inputs(rows, width, seed=7)
    logits[:16, -1] = 30.0
    logits[16:64] = (torch.randn(48, width, device="cuda") + torch.nn.functional.one_hot(
        torch.tensor(width - 1, device="cuda"), width) * 4).bfloat16()
    params.repetition_penalty[16:64] = 3.0
    params.temperature[16:64] = 0.5
    gen = torch.Generator().manual_seed(8)
    semantic = begin + torch.randint(0, n_ids, (rows, WINDOW), generator=gen)
    other = torch.where(torch.rand(rows, WINDOW, generator=gen) < 0.5, extra,
                        torch.randint(0, 3000, (rows, WINDOW), generator=gen))
    history = torch.where(torch.rand(rows, WINDOW, generator=gen) < 0.8, semantic, other)
    history[16:64, 1:] = semantic[16:64, 1:]
    history[16:48, 0], history[48:64, 0] = extra, begin + n_ids
    history, valid = history.cuda(), valid.clone()
    valid[16:64, 0] = True
    embeddings = torch.randn(n_ids, 64, device="cuda").bfloat16()

    tokens, codes, embedded = _run(logits, history, valid, params, counter, embeddings, begin, n_ids, extra)

    def plain(valid):
        is_semantic = (history >= begin) & (history < begin + n_ids)
        index = torch.where(is_semantic, history - begin, torch.full_like(history, n_ids))
        return sample(logits, params, index, valid & (is_semantic | (history == extra)), counter)

    chosen = plain(valid)
    named = chosen < n_ids
    assert torch.equal(tokens, torch.where(named, begin + chosen, torch.full_like(chosen, extra)))
    assert torch.equal(codes, torch.where(named, chosen, torch.zeros_like(chosen)))
    assert torch.equal(embedded, embeddings[codes])
    assert (~named[:16]).all() and (~named[48:64]).any()
    unpenalised = valid.clone()
    unpenalised[16:48, 0] = False
    assert not torch.equal(plain(unpenalised)[16:48], chosen[16:48])  # the <|im_end|> penalty mattered


def test_rows_are_independent_of_their_batch():
    logits, history, valid, params, counter = _inputs(64, 1024, seed=3)
    embeddings = torch.randn(1024, 32, device="cuda").bfloat16()
    together = _run(logits, history, valid, params, counter, embeddings, 0, 1024, -1)[0]
    for row in (0, 17, 63):
        one = SamplingTensors(params.temperature[row:row + 1], params.top_p[row:row + 1],
                              params.repetition_penalty[row:row + 1], params.noise_key[row:row + 1])
        alone = _run(logits[row:row + 1], history[row:row + 1], valid[row:row + 1], one, counter[row:row + 1],
                     embeddings, 0, 1024, -1)[0]
        assert alone.item() == together[row].item()
