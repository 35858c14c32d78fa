"""Time sampling_kernel.sample_one_row (ONE_ROW_IDS x ONE_ROW_CHUNK settings, num_warps 8) against sample_rows
and Inductor's compiled sample() for one row, in CUDA graphs, and check each setting's ids against sample().

    python bench_one_row.py    # from the repository root
"""
import itertools, sys, torch
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
import engine.runtime.sampling_kernel as K
from engine.runtime.sampling import SamplingTensors, sample
from graph_timing import microseconds_per_call


def timed(fn):
    """us per call of fn, 20 calls captured in a CUDA graph and replayed (scripts/graph_timing)."""
    return microseconds_per_call(lambda i: fn(), 20, 20)


for width in (1024, 4097):
    logits = (torch.randn(1, width, device="cuda") * 3).bfloat16()
    history = torch.randint(0, width, (1, 16), device="cuda"); valid = torch.ones(1, 16, dtype=torch.bool, device="cuda")
    p = SamplingTensors.build([0.8], [0.8], [1.1], [123], "cuda"); counter = torch.tensor([5], device="cuda")
    emb = torch.randn(width, 1024, device="cuda").bfloat16()
    args = (logits, history, valid, p.temperature, p.top_p, p.repetition_penalty, p.noise_key, counter, emb, 0, width, -1)
    expected = sample(logits, p, history, valid, counter)
    compiled = torch.compile(lambda: sample(logits, p, history, valid, counter))
    print(f"{width} inductor sample() {timed(compiled):.2f} us", flush=True)
    print(f"{width} sample_rows {timed(lambda: K.sample_rows(*args)):.2f} us", flush=True)
    for ids, chunk in itertools.product((8, 16, 32, 64), (512, 1024, 2048)):
        K.ONE_ROW_IDS, K.ONE_ROW_CHUNK = ids, chunk
        same = torch.equal(K.sample_one_row(*args)[0], expected)
        print(f"{width} one_row ids {ids} chunk {chunk} {timed(lambda: K.sample_one_row(*args)):.2f} us {'same' if same else 'DIFF'}", flush=True)
