"""Batch 1's one-kernel sampler (engine/runtime/fused_sampling.py) against the plain sampling path
(CUDA with Triton only)."""

import pytest
import torch

from engine.runtime.generate import sample_and_embed
from engine.runtime.sampling import REPETITION_WINDOW, SamplingTensors

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
fused = pytest.importorskip("engine.runtime.fused_sampling", reason="needs Triton")


def case(seed: int, rows: int, vocab: int, dim: int = 1024):
    """Logits of varied sharpness (ties included), per-row parameters, a partly valid history."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * (0.5 + 3 * torch.rand(rows, 1, generator=gen))
    logits[:, 100:110] = logits[:, 7:8]  # equal logits rank by index
    params = SamplingTensors.build(
        temperature=(0.3 + torch.rand(rows, generator=gen)).tolist(),
        top_p=torch.tensor([0.5, 0.8, 0.95, 1.0])[torch.randint(0, 4, (rows,), generator=gen)].tolist(),
        repetition_penalty=(1 + 0.3 * torch.rand(rows, generator=gen)).tolist(),
        noise_key=torch.randint(0, 2 ** 40, (rows,), generator=gen).tolist(), device="cuda")
    history = torch.randint(0, vocab, (rows, REPETITION_WINDOW), generator=gen)
    history[:, :4] = logits.argmax(-1, keepdim=True)  # the likeliest id penalised
    valid = torch.arange(REPETITION_WINDOW)[None] < torch.randint(0, REPETITION_WINDOW + 1, (rows, 1), generator=gen)
    counter = torch.randint(0, 2 ** 20, (rows,), generator=gen)
    embeddings = torch.randn(vocab, dim, generator=gen)
    cuda = {"device": "cuda"}
    return (logits.to(torch.bfloat16).to(**cuda), params, history.to(**cuda), valid.to(**cuda), counter.to(**cuda),
            embeddings.to(torch.bfloat16).to(**cuda))


def run_fused(logits, params, history, valid, counter, embeddings):
    return fused.sample_codebook(logits, params.temperature, params.top_p, params.repetition_penalty,
                                 params.noise_key, counter, history, valid, embeddings)


@pytest.mark.parametrize("rows,vocab", [(1, 1024), (3, 1024), (1, 4097)])
def test_same_codes_and_embeddings_as_the_plain_path(rows, vocab):
    for seed in range(40):
        inputs = case(seed, rows, vocab)
        want_codes, want_embedded = sample_and_embed(*inputs)
        codes, embedded = run_fused(*inputs)
        assert torch.equal(codes, want_codes), (seed, codes, want_codes)
        assert torch.equal(embedded, want_embedded)
    counters = fused._counters[(torch.device("cuda", torch.cuda.current_device()), rows)]
    assert counters[:, 0].eq(fused.NO_THRESHOLD).all() and counters[:, 1].eq(0).all()  # left at rest


def test_replayed_in_a_cuda_graph_with_new_inputs():
    """Captured once, replayed with each case's inputs copied in: the counters reset themselves."""
    static = case(0, 1, 1024)
    run_fused(*static)  # first call outside the capture (allocates the row counters)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        codes, embedded = run_fused(*static)
    for seed in range(1, 20):
        fresh = case(seed, 1, 1024)
        for mine, new in zip(static, fresh, strict=True):
            if isinstance(mine, SamplingTensors):
                for name in ("temperature", "top_p", "repetition_penalty", "noise_key"):
                    getattr(mine, name).copy_(getattr(new, name))
            else:
                mine.copy_(new)
        graph.replay()
        want_codes, want_embedded = sample_and_embed(*fresh)
        assert torch.equal(codes, want_codes) and torch.equal(embedded, want_embedded), seed
