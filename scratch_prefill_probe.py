"""Scratch (not committed): why int8 prefill is slow."""
import time, sys
import torch
from torch.profiler import ProfilerActivity, profile
from engine import compilation
from engine.config import EngineConfig
from engine.loader import load_models
from engine.runtime.kv_cache import KVCache
from engine.runtime.step_runner import StepRunner

q = sys.argv[1]
models = load_models(EngineConfig(random_weights=True, device="cuda", quantize=q))
m = models.model; c = m.config
cache = KVCache(c.n_layer, 1, c.n_local_heads, 4096, c.head_dim, models.placement.dtype, "cuda")
for mode in ("off", "on"):
    runner = StepRunner(m, cache, compilation.decide(mode, torch.device("cuda")))
    prompt = torch.randint(0, 4000, (c.num_codebooks + 1, 281), device="cuda")
    for _ in range(3):
        torch.cuda.synchronize(); t = time.perf_counter(); runner.prefill(0, prompt); torch.cuda.synchronize()
    print(q, "compile", mode, f"prefill {1000*(time.perf_counter()-t):.1f} ms", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.prefill(0, prompt); torch.cuda.synchronize()
    ks = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            a = ks.setdefault(e.name, [0, 0.0]); a[0] += 1; a[1] += e.device_time
    for n, (cnt, us) in sorted(ks.items(), key=lambda kv: -kv[1][1])[:6]:
        print(f"   {us/1000:8.2f} ms {cnt:4d}x {n[:110]}")
