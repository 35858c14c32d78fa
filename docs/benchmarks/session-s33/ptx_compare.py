"""Run 9's two kernels against main's one kernel, compiled for sm_90a without a GPU (Triton 3.6.0 and its ptxas
toolchain): main's _attend_split with early_keys (one row) must give the PTX of run 9's tree
(b4f5d44 + early-keys-run9.diff), and without it (batches) the PTX of b4f5d44, line for line (debug info aside).

    PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s33/ptx_compare.py   # from the repository root
"""
import atexit, os, re, subprocess, sys
sys.path.insert(0, ".")
HERE = "docs/benchmarks/session-s33"
for name in ("_da_base", "_da_measured"):  # the references as modules of engine.model (relative imports)
    path = f"engine/model/{name}.py"
    with open(path, "w") as f:
        f.write(subprocess.run(["git", "show", "b4f5d44:engine/model/decode_attention.py"], check=True,
                               capture_output=True, text=True).stdout)
    atexit.register(os.remove, path)
    if name == "_da_measured":
        subprocess.run(["patch", "-s", path, f"{HERE}/early-keys-run9.diff"], check=True)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import engine.model.decode_attention as new
import engine.model._da_measured as measured
import engine.model._da_base as base

target = GPUTarget("cuda", 90, 32)
sig = {"qkv_ptr": "*bf16", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16", "eps": "fp32", "rope_ptr": "*fp32",
       "positions_ptr": "*i64", "k_ptr": "*bf16", "v_ptr": "*bf16", "partial_ptr": "*fp32", "lse_ptr": "*fp32",
       "out_ptr": "*bf16", "n_keys": "i32", "qkv_stride_b": "i32", "rope_stride_b": "i32", "k_stride_b": "i32",
       "k_stride_h": "i32", "k_stride_l": "i32", "v_stride_b": "i32", "v_stride_h": "i32", "v_stride_l": "i32"}


def ptx(module, split, block, direct, early=None):
    fn = module._attend_split
    names = list(fn.arg_names)
    const = {"scale_log2": 0.1275, "n_heads": 16, "kv_heads": 8, "group": 2, "rows": 16, "head_dim": 128,
             "has_qk_norm": True, "split_keys": split, "block_keys": block, "ieee": False, "direct": direct, "pdl": True}
    if early is not None:
        const["early_keys"] = early
    full = dict(sig); full.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in const.items()})
    text = triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 2}).asm["ptx"]
    keep = [l for l in text.splitlines() if not re.match(r"\s*(\.loc|\.file|//|\$L__|\.section|\.b8|\.b32|\.b64|\.debug)", l)
            and "debug" not in l]
    body = "\n".join(keep)
    return body[body.index(".visible .entry"):]

bad = 0
for split, block, direct, ref, early, what in [(64, 64, False, measured, True, "one row, slow (run 9's kernel)"),
                                               (16, 16, True, measured, True, "one row, fast (run 9's kernel)"),
                                               (256, 64, False, base, False, "batches, slow (b4f5d44's kernel)"),
                                               (16, 16, True, base, False, "batches, fast (b4f5d44's kernel)")]:
    a, b = ptx(new, split, block, direct, early), ptx(ref, split, block, direct)
    same = a == b
    bad += not same
    print(f"{what}: {'identical PTX' if same else 'PTX DIFFERS'} ({len(a.splitlines())} / {len(b.splitlines())} lines)")
    if not same:
        print("\n".join(l for l in __import__("difflib").unified_diff(b.splitlines(), a.splitlines(), lineterm="", n=0))[:3000])
print("bad", bad)
