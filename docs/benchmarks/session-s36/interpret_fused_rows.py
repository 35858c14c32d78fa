"""fused-rows-prenormed (rebased on main, session s36): _fused_rows in Triton's interpreter against the
plain ops in fp32, every flag combination the step uses (residual, gated, weight scale, norm):

    TRITON_INTERPRET=1 PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s36/interpret_fused_rows.py
"""
import sys
sys.path.insert(0, ".")
import torch
import torch.nn.functional as F
from engine.model import fused_linear as fl

failures = 0
for rows, K, N in [(5, 64, 48), (17, 96, 40)]:
    for gated, residual, scaled, normed in [(False, False, False, False), (False, True, False, False),
                                            (True, False, False, False), (False, False, True, False),
                                            (False, False, False, True), (True, True, True, True)]:
        g = torch.Generator().manual_seed(rows * K + N)
        x = torch.randn(rows, K, generator=g)
        w = torch.randn(2 * N if gated else N, K, generator=g) / K ** 0.5
        r = torch.randn(rows, N, generator=g) if residual else None
        s = torch.rand(w.shape[0], generator=g) + 0.5 if scaled else None
        nw = torch.rand(K, generator=g) + 0.5 if normed else None
        got = fl.launch_rows(fl._fused_rows, x, w, s, nw, r, 1e-6, gated, settings=fl.RowsLaunch(block_n=16, block_k=32))
        xin = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw if normed else x
        out = F.linear(xin, w) * (s if scaled else 1)
        if gated:
            out = F.silu(out[:, :N]) * out[:, N:]
        if residual:
            out = out + r
        err = (got - out).abs().max().item()
        ok = got.shape == out.shape and err <= 1e-4
        failures += not ok
        print(f"rows {rows} K {K} N {N} gated {gated} residual {residual} scaled {scaled} normed {normed}: "
              f"error {err:.2e} {'ok' if ok else 'FAIL'}")
print("FAILURES", failures)
