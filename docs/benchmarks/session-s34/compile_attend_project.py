"""Compile _attend_and_project for sm_90a without a GPU and print ptxas's registers and spills per setting
(S1-mini's fast layer: 16 query heads, 8 kv heads, head_dim 64, a 10-position cache, 1,024 columns, bf16):

    PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s34/compile_attend_project.py
"""
import os, subprocess, sys
sys.path.insert(0, ".")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.model.attend_project import _attend_and_project as fn  # needs attend-project.diff applied

ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
sig = {"qkv_ptr": "*bf16", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16", "eps": "fp32", "rope_ptr": "*fp32",
       "positions_ptr": "*i64", "k_ptr": "*bf16", "v_ptr": "*bf16", "w_ptr": "*bf16", "w_scale_ptr": "*bf16",
       "residual_ptr": "*bf16", "out_ptr": "*bf16", "n_keys": "i32", "k_stride_h": "i32", "k_stride_l": "i32",
       "v_stride_h": "i32", "v_stride_l": "i32"}
for block_n, warps in [(8, 8), (16, 8), (4, 8), (8, 16), (16, 16), (4, 4)]:
    const = {"scale_log2": 0.18, "n_heads": 16, "kv_heads": 8, "head_dim": 64, "has_qk_norm": False, "keys": 16,
             "has_w_scale": False, "block_n": block_n, "pdl": True, "weight_eviction": ""}
    names = list(fn.arg_names)
    full = dict(sig); full.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in const.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
    open("/tmp/ap.ptx", "w").write(ptx)
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", "/tmp/ap.ptx", "-o", "/tmp/ap.cubin"], capture_output=True, text=True)
    info = " ".join(l.strip() for l in (out.stderr + out.stdout).splitlines() if "registers" in l or "spill" in l)
    print(f"block_n {block_n} warps {warps}: {info}")
