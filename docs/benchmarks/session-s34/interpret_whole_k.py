"""whole-k-blocks.diff's settings (one block over K, 3072 as 4096 masked) in Triton's interpreter against the plain
ops in fp32, and against main's settings in bf16 (equal up to the order of the sums):

    TRITON_INTERPRET=1 PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s34/interpret_whole_k.py
"""
import sys
sys.path.insert(0, ".")
import torch
import torch.nn.functional as F
from engine.model import fused_linear as fl

failures = 0
for K, N, main_setting, whole in [(2048, 1024, fl.Launch(block_n=2, num_warps=4), fl.Launch(block_n=2, block_k=2048, num_warps=4)),
                                  (3072, 1024, fl.Launch(), fl.Launch(block_n=4, block_k=4096, num_warps=8))]:
    g = torch.Generator().manual_seed(K)
    x, w, r = torch.randn(1, K, generator=g), torch.randn(N, K, generator=g) / K ** 0.5, torch.randn(1, N, generator=g)
    got = fl.launch(fl._fused_linear, x, w, None, None, r, 0.0, False, settings=whole)
    err = (got - (r + F.linear(x, w))).abs().max().item()
    ok = err <= 1e-5
    b = [t.to(torch.bfloat16) for t in (x, w, r)]
    diff = (fl.launch(fl._fused_linear, b[0], b[1], None, None, b[2], 0.0, False, settings=whole).float()
            - fl.launch(fl._fused_linear, b[0], b[1], None, None, b[2], 0.0, False, settings=main_setting).float()).abs().max().item()
    ok &= diff <= 0.0625  # one bf16 unit at |out| < 8 at most
    failures += not ok
    print(f"K {K}: fp32 error {err:.2e}; bf16 against main's setting {diff:.3g} {'ok' if ok else 'FAIL'}")
print("FAILURES", failures)
