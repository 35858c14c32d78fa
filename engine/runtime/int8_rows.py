"""One-row int8 matmuls of the compiled decode step as a Triton kernel of our own.

A batch-1 decode step multiplies one activation row by every weight matrix: it is bound by reading
the weights, so int8 weights should halve its time. Inductor does not get there on its own (H100,
torch 2.11): with torchao's int8 weights its reduction kernels read them at under a third of the
bandwidth of the bf16 ones (gate/up: 8.4 us against 5.9 us for twice the bytes). This kernel reads
the int8 rows with wide loads, accumulates in fp32 and applies each row's scale once at the end.

Only compiled CUDA steps use it (it runs inside their graphs as a user-defined Triton kernel);
more than one row, and every eager path, keep torchao's own matmul. Swapping it in keeps the
state dict as it is: the module keeps torchao's weight parameter, and the kernel reads its int8
values and scales through buffers that are not saved.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@functools.cache
def _row_matmul_op():
    """The custom op s1mini::int8_row_matmul(x (K,), weight (N, K) int8, scale (N,)) -> (N,) in
    x's dtype; registered on first use (it needs Triton)."""
    import triton
    import triton.language as tl
    from torch.library import triton_op, wrap_triton

    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w)
               for n, k, w in ((1, 1024, 2), (1, 1024, 4), (2, 1024, 4), (2, 2048, 4), (4, 512, 4), (4, 1024, 4),
                               (4, 2048, 8), (8, 256, 4), (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8))]

    # Programmatic dependent launch (Hopper and newer), as the compiled step's Inductor kernels do
    # (see CompilePolicy.inductor_options): this kernel may start while its predecessor finishes,
    # waits for it before reading anything, and lets its successor start likewise.
    pdl = torch.cuda.get_device_capability() >= (9, 0) and os.environ.get("TORCHINDUCTOR_ENABLE_PDL", "1") != "0"

    @triton.autotune(configs=configs, key=["N", "K"])
    @triton.jit
    def kernel(x_ptr, w_ptr, scale_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0)
            acc += w.to(tl.float32) * x[None, :]
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, (tl.sum(acc, axis=1) * scale).to(out_ptr.dtype.element_ty), mask=row_ok)

    @triton_op("s1mini::int8_row_matmul", mutates_args=())
    def int8_row_matmul(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
        n, k = weight.shape
        out = torch.empty(n, dtype=x.dtype, device=x.device)
        wrap_triton(kernel)[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](x, weight, scale, out, n, k, PDL=pdl,
                                                                             launch_pdl=pdl)
        return out

    return int8_row_matmul


def int8_row_matmul(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """x (K,) contiguous, weight (N, K) int8 contiguous, scale (N,) -> (N,): sum_k x[k] weight[n, k] * scale[n].
    Compiled code calls torch.ops.s1mini.int8_row_matmul, which this registers (Dynamo must not trace
    the registration)."""
    _row_matmul_op()
    return torch.ops.s1mini.int8_row_matmul(x, weight, scale)


class Int8RowKernelLinear(nn.Module):
    """A torchao int8 Linear (per-row scales) whose one-row calls run int8_row_matmul."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight  # torchao's Int8Tensor parameter: the state dict stays the same
        self.bias = linear.bias
        self.register_buffer("qdata", linear.weight.qdata.contiguous(), persistent=False)
        self.register_buffer("row_scale", linear.weight.scale.reshape(-1).contiguous(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if math.prod(x.shape[:-1]) != 1:
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.s1mini.int8_row_matmul(x.reshape(-1), self.qdata, self.row_scale).view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def use_int8_row_kernel(module: nn.Module) -> int:
    """Swap every per-row int8 Linear under `module` for Int8RowKernelLinear; returns how many.
    On CUDA this registers the kernel's op first: compiled code must find it, not trace its making."""
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and _per_row_int8(child.weight):
                if child.weight.qdata.is_cuda:
                    _row_matmul_op()
                setattr(parent, name, Int8RowKernelLinear(child))
                swapped += 1
    return swapped


def _per_row_int8(weight: Tensor) -> bool:
    """torchao weight-only int8 with one scale per output row (what --quantize int8 makes)."""
    qdata, scale = getattr(weight, "qdata", None), getattr(weight, "scale", None)
    return (qdata is not None and scale is not None and qdata.dtype == torch.int8 and qdata.dim() == 2
            and scale.numel() == qdata.shape[0] and getattr(weight, "act_quant_kwargs", None) is None
            and getattr(weight, "act_pre_scale", None) is None)
