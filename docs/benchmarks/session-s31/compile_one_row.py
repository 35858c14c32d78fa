"""Compile _sample_one_row (one-row-sampler.diff applied) for sm_90a without a GPU and print ptxas's registers
and spills per setting (ids a program, chunk, row width), 8 warps:

    python docs/benchmarks/session-s31/compile_one_row.py   # needs the triton package (its bundled ptxas)
"""
import sys, triton
sys.path.insert(0, ".")
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import engine.runtime.sampling_kernel as K
target = GPUTarget("cuda", 90, 32)

names = list(K._sample_one_row.arg_names)
print(names)
import subprocess, os
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
sig = {"logits_ptr": "*bf16", "history_ptr": "*i64", "valid_ptr": "*i1", "temperature_ptr": "*fp32", "top_p_ptr": "*fp32",
       "penalty_ptr": "*fp32", "key_ptr": "*i64", "counter_ptr": "*i64", "embeddings_ptr": "*bf16", "token_ptr": "*i64",
       "code_ptr": "*i64", "embedded_ptr": "*bf16", "race_ptr": "*i64", "ticket_ptr": "*i64", "n_logits": "i32",
       "id_begin": "i32", "n_ids": "i32", "extra_id": "i32"}
for ids, chunk, width in [(16, 1024, 1024), (16, 1024, 4097), (32, 1024, 4097), (8, 2048, 4097), (64, 512, 4097)]:
    const = {"WINDOW": 16, "DIM": 1024, "BLOCK_I": ids, "CHUNK": chunk, "CHUNKS": -(-width // chunk), "BLOCK_D": 1024, "pdl": True}
    full_sig = dict(sig); full_sig.update({k: "constexpr" for k in const})
    src = ASTSource(fn=K._sample_one_row, signature=full_sig, constexprs={(names.index(k),): v for k, v in const.items()})
    k = triton.compile(src, target=target, options={"num_warps": 8})
    open("/tmp/k.ptx", "w").write(k.asm["ptx"])
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", "/tmp/k.ptx", "-o", "/tmp/k.cubin"], capture_output=True, text=True)
    info = [l for l in (out.stderr + out.stdout).splitlines() if "registers" in l or "spill" in l]
    print(ids, chunk, width, " | ".join(i.strip() for i in info))
