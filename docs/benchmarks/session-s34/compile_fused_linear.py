"""Registers and spills of _fused_linear per (shape, setting), compiled for sm_90a without a GPU, and how many of a
projection's programs an H100 (132 SMs, 65,536 registers and 64 warps an SM) holds at once: a program that is
resident when the kernel before it ends has loaded its weights before its PDL wait.

    PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s34/compile_fused_linear.py
"""
import os, subprocess, sys
sys.path.insert(0, ".")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.model.fused_linear import _fused_linear as fn

ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "w_scale_ptr": "*bf16", "norm_ptr": "*bf16", "residual_ptr": "*bf16",
       "out_ptr": "*bf16", "eps": "fp32"}
CASES = [  # name, K, N, norm, gated, residual, block_n, block_k, warps
    ("slow out (main)", 2048, 1024, False, False, True, 2, 1024, 4),
    ("slow out whole K", 2048, 1024, False, False, True, 2, 2048, 4),
    ("slow out whole K w8", 2048, 1024, False, False, True, 2, 2048, 8),
    ("gate/up (main)", 1024, 3072, True, True, False, 4, 512, 8),
    ("gate/up whole K", 1024, 3072, True, True, False, 4, 1024, 8),
    ("gate/up whole K n2", 1024, 3072, True, True, False, 2, 1024, 8),
    ("down (main)", 3072, 1024, False, False, True, 4, 1024, 8),
    ("down whole K", 3072, 1024, False, False, True, 4, 4096, 8),
    ("down whole K n2", 3072, 1024, False, False, True, 2, 4096, 8),
    ("down whole K n2 w4", 3072, 1024, False, False, True, 2, 4096, 4),
]
for name, K, N, norm, gated, residual, block_n, block_k, warps in CASES:
    const = {"K": K, "N": N, "has_w_scale": False, "has_norm": norm, "gated": gated, "has_residual": residual,
             "block_n": block_n, "block_k": block_k, "pdl": True, "weight_eviction": ""}
    names = list(fn.arg_names)
    full = dict(sig); full.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in const.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1}).asm["ptx"]
    open("/tmp/fl.ptx", "w").write(ptx)
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", "/tmp/fl.ptx", "-o", "/tmp/fl.cubin"], capture_output=True, text=True)
    text = out.stderr + out.stdout
    regs = int(text.split("Used ")[1].split(" registers")[0])
    spills = text.split("bytes spill stores")[0].split(",")[-1].strip()
    lines = ptx.splitlines()
    wait = next(i for i, l in enumerate(lines) if "griddepcontrol.wait" in l)
    weight_loads_before = sum(1 for l in lines[:wait] if "ld.global" in l)
    per_sm = min(65536 // (regs * 32 * warps), 64 // warps, 32)
    programs = -(-N // block_n)
    print(f"{name:22s} {block_n}x{block_k} w{warps}: {regs:3d} registers, spill {spills} B; {programs} programs, "
          f"{per_sm} an SM -> {min(programs, per_sm * 132)} resident; {weight_loads_before} loads before the wait")
