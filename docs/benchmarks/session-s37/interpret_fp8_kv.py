"""decode_attention over a KV cache of another dtype than its queries' (EngineConfig.kv_cache="fp8"),
in Triton's interpreter on the CPU, against Attention.attend's plain path over the same caches:

    git checkout fp8-kv   # or: git apply docs/benchmarks/session-s37/fp8-kv-cache.diff
    TRITON_INTERPRET=1 python docs/benchmarks/session-s37/interpret_fp8_kv.py   # needs the triton package; no GPU

Both paths write the new key and value rounded to the cache's dtype and read every cached one back
in the query's dtype (fp32 here), so they must agree to fp32 rounding: for batches (split keys, the
new key stored then read back) and for one row (early keys: the new key and value used from
registers), with fp8 and with bf16 caches.

The interpreter's own float conversions (Triton 3.6) are not the GPU's: fp32 to bf16 truncates,
and its round-to-nearest drops the carry into the next power of two (-1.9993 to e4m3 gives -1.0;
torch and the GPU's cvt.rn give -2.0). They are replaced here by torch's conversions, which round
to nearest even as the GPU does.
"""
import sys

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

sys.path.insert(0, "docs/benchmarks/session-s32")
from interpreted_attention import decode_attention as A  # noqa: E402
from engine.model.dual_ar import Attention, KVView, rope_table  # noqa: E402

TORCH_DTYPES = {tl.float32: torch.float32, tl.bfloat16: torch.bfloat16, tl.float16: torch.float16,
                tl.float8e4nv: torch.float8_e4m3fn}


def torch_conversion(data, input_dtype, output_dtype, rounding_mode):
    """The interpreter's _convert_float done by torch: the same bits the GPU gives."""
    source = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).copy()).view(TORCH_DTYPES[input_dtype])
    converted = source.to(TORCH_DTYPES[output_dtype]).view(torch.uint8).numpy()
    return converted.view(getattr(np, f"uint{output_dtype.primitive_bitwidth}"))


interpreter._convert_float = torch_conversion
original_cast = interpreter.InterpreterBuilder.cast_impl


def cast(self, src, dst_type):  # float to float through torch_conversion; the rest as the interpreter does
    if src.dtype.scalar in TORCH_DTYPES and dst_type.scalar in TORCH_DTYPES:
        data = torch_conversion(src.data, src.dtype.scalar, dst_type.scalar, None)
        return interpreter.TensorHandle(data.view(interpreter._get_np_dtype(dst_type)), dst_type.scalar)
    return original_cast(self, src, dst_type)


interpreter.InterpreterBuilder.cast_impl = cast
torch.manual_seed(0)
H, KV, D, cap = 4, 2, 16, 512
attn = Attention(H * D, H, KV, D, 1e-6, True, False, False)
attn.requires_grad_(False)
attn.q_norm.weight.data = 1 + 0.1 * torch.randn(D)
attn.k_norm.weight.data = 1 + 0.1 * torch.randn(D)
worst = 0.0
for cache_dtype in (torch.float8_e4m3fn, torch.bfloat16):
  for batch, n_keys, one_row in ((6, 300, False), (1, 300, True), (1, 37, True)):
    qkv = 3 * torch.randn(batch, (H + 2 * KV) * D)
    k_cache, v_cache = (torch.randn(batch, KV, cap, D).to(cache_dtype) for _ in range(2))
    positions = torch.randint(0, n_keys, (batch,))
    positions[-1] = n_keys - 1
    rope = rope_table(cap, D, 1e6)[positions][:, None]
    k, v = k_cache.clone(), v_cache.clone()
    out = A.launch(A._attend_split, A._merge_splits, qkv, *attn.kernel_norms(), rope.reshape(batch, -1), k, v,
                   positions, n_keys, H, one_row)
    keys = torch.arange(n_keys)
    view = KVView(k_cache.clone(), v_cache.clone(), positions[:, None], keys, keys <= positions[:, None, None, None])
    plain = attn.attend(qkv[:, None], rope, view)[:, 0]
    assert k.dtype == cache_dtype
    caches_equal = torch.equal(k.view(torch.uint8), view.k.view(torch.uint8)) and \
        torch.equal(v.view(torch.uint8), view.v.view(torch.uint8))
    error = (out - plain).abs().max().item()
    worst = max(worst, error)
    print(f"{cache_dtype} cache, batch {batch}, {n_keys} keys, one_row={one_row}: caches bit-equal {caches_equal}, "
          f"output vs plain {error:.2e}")
    assert caches_equal and error < 1e-5
print(f"fp8 and bf16 caches under fp32 queries: the kernel equals the plain path (worst {worst:.2e})")
