"""_fused_linear with early-loads-fused-linear.diff applied against f889959's (unchanged since), in Triton's
interpreter on the CPU (no PDL there): equal bit for bit, bf16 and fp32, for S1-mini's projection shapes
with their norms, gates and residuals. Reading the norm's weights one element off makes it print bad 6.

    patch -p1 < docs/benchmarks/session-s33/early-loads-fused-linear.diff
    TRITON_INTERPRET=1 PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s33/interpret_fused_linear.py
"""
import atexit, os, subprocess, sys
sys.path.insert(0, ".")
import torch
path = "engine/model/_fl_base.py"
open(path, "w").write(subprocess.run(["git", "show", "f889959:engine/model/fused_linear.py"], check=True,
                                     capture_output=True, text=True).stdout)
atexit.register(os.remove, path)
import engine.model.fused_linear as new
import engine.model._fl_base as base
torch.manual_seed(0)
bad = 0
for K, N, norm, gated, residual in [(1024, 4096, True, False, False), (2048, 1024, False, False, True),
                                    (1024, 2048, True, False, False), (1024, 1024, False, False, True),
                                    (1024, 3072, True, True, False), (3072, 1024, False, False, True),
                                    (1024, 4096, True, False, True), (3072, 1024, True, False, True)]:
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, K).to(dtype)
        w = (torch.randn(2 * N if gated else N, K) * 0.05).to(dtype)
        nw = (1 + 0.1 * torch.randn(K)).to(dtype) if norm else None
        res = torch.randn(1, N).to(dtype) if residual else None
        a = new.launch(new._fused_linear, x, w, None, nw, res, 1e-6, gated)
        b = base.launch(base._fused_linear, x, w, None, nw, res, 1e-6, gated)
        same = torch.equal(a, b)
        bad += not same
        print(K, N, norm, gated, residual, dtype, "equal" if same else f"DIFFERENT {(a.float() - b.float()).abs().max()}")
print("bad", bad)
