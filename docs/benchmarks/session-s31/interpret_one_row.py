"""sample_one_row (one-row-sampler.diff applied) against sample() and sample_rows in Triton's interpreter on the CPU:

    TRITON_INTERPRET=1 python docs/benchmarks/session-s31/interpret_one_row.py   # needs the triton package; no GPU
"""
import sys, torch
sys.path.insert(0, ".")  # run from the repository root
import engine.runtime.sampling_kernel as K
import types, triton.language as tl
import triton
@triton.jit
def _exp(x): return tl.exp(x)
@triton.jit
def _log(x): return tl.log(x)
@triton.jit
def _div(a, b): return a / b
K.libdevice = types.SimpleNamespace(exp=_exp, log=_log, div_rn=_div)  # the interpreter has no libdevice
from engine.runtime.sampling import SamplingTensors, sample
torch.manual_seed(0)
bad = 0; n = 0
for width in (24, 1024, 4097):
    for trial in range(12 if width < 4097 else 6):
        gen = torch.Generator().manual_seed(trial * 7 + width)
        logits = (torch.randn(1, width, generator=gen) * 3).bfloat16()
        if trial % 4 == 0: logits = torch.randn(1, width, generator=gen).round().bfloat16()
        history = torch.randint(0, width, (1, 16), generator=gen)
        valid = torch.rand(1, 16, generator=gen) < 0.7
        top_p = [1.0, 0.0, 0.8, 0.5, 0.95, 0.3][trial % 6]
        temp = [0.7, 0.0, 1.2, 0.4][trial % 4]
        pen = [1.1, 1.0, 1.5][trial % 3]
        params = SamplingTensors.build([temp], [top_p], [pen], [trial * 12345 + 17], "cpu")
        counter = torch.tensor([trial * 64 + 3])
        emb = torch.randn(width, 8).bfloat16()
        ids, codes, embedded = K.sample_one_row(logits, history, valid, params.temperature, params.top_p,
            params.repetition_penalty, params.noise_key, counter, emb, 0, width, -1)
        ref_rows = K.sample_rows(logits, history, valid, params.temperature, params.top_p,
            params.repetition_penalty, params.noise_key, counter, emb, 0, width, -1)[0]
        expected = sample(logits, params, history, valid, counter)
        n += 1
        ok = torch.equal(ids, expected) and torch.equal(codes, expected) and torch.equal(embedded, emb[expected])
        bad += not ok
        print(width, trial, "top_p", top_p, "T", temp, "ids", ids.item(), "plain", expected.item(), "rows-kernel", ref_rows.item(), "OK" if ok else "DIFF")
print(f"{n - bad}/{n} equal")
# codebook 0: indices map to tokens begin + i, index n_ids to extra; history holds tokens
width, begin, extra = 4097, 151_000, 150_000
n_ids = width - 1
same = 0
for trial in range(6):
    gen = torch.Generator().manual_seed(100 + trial)
    logits = (torch.randn(1, width, generator=gen) * 2).bfloat16()
    if trial < 3: logits[0, -1] = 6.0  # favour <|im_end|>
    semantic = begin + torch.randint(0, n_ids, (1, 16), generator=gen)
    history = torch.where(torch.rand(1, 16, generator=gen) < 0.7, semantic, torch.full((1, 16), extra))
    valid = torch.rand(1, 16, generator=gen) < 0.8
    params = SamplingTensors.build([0.6], [0.9], [3.0 if trial % 2 else 1.2], [trial + 5], "cpu")
    counter = torch.tensor([trial])
    emb = torch.randn(n_ids, 8).bfloat16()
    one = K.sample_one_row(logits, history, valid, params.temperature, params.top_p, params.repetition_penalty,
                           params.noise_key, counter, emb, begin, n_ids, extra)
    rows = K.sample_rows(logits, history, valid, params.temperature, params.top_p, params.repetition_penalty,
                         params.noise_key, counter, emb, begin, n_ids, extra)
    ok = all(torch.equal(a, b) for a, b in zip(one, rows))
    same += ok
    print("cb0", trial, one[0].item(), rows[0].item(), "OK" if ok else "DIFF")
print(f"cb0 {same}/6 equal to sample_rows")
