"""Convolutions run by cuDNN or as one matmul (im2col), whichever is faster for the shape.

cuDNN runs a few of S1-mini's decoder convolutions (one at batch 64, 384 channels with dilation 9
over 4,096 samples) several times slower than the others of their kind, and slower than the same
convolution written as a matmul over the input's k shifted copies (im2col). Which shapes cuDNN
handles badly depends on the GPU and cuDNN version, so each shape is timed once,
both ways, while `tuning()` is on (the codec runner turns it on while it captures its graphs) and
the faster one kept (im2col only when clearly faster: near ties keep cuDNN, so a restart makes the
same choice); shapes never timed run cuDNN. Timing and choices live on the one thread that drives the
codec (the engine's GPU worker). Every plain stride-1 nn.Conv1d with more than one tap is tuned (cuDNN
also spends time changing NCHW to NHWC and back around its kernels for undilated ones); the codec's
weight norm must be fused first, as every loaded codec's is for inference.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn


# The stacked copies are k times the input: built this many bytes at a time (a few batch rows), so
# that a graph's memory pool does not keep gigabytes of them at large batches.
IM2COL_BYTES = 256 << 20


def conv1d_im2col(x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int) -> Tensor:
    """F.conv1d(x, weight, bias, dilation=dilation) (stride 1, no padding, one group) as a matmul of the
    (c_out, k * c_in) weights with the k shifted copies of x stacked on the channels."""
    k = weight.shape[-1]
    length = x.shape[-1] - (k - 1) * dilation
    flat_weight = weight.permute(0, 2, 1).reshape(weight.shape[0], -1)
    rows_per_part = max(1, IM2COL_BYTES // (k * x[0].numel() * x.element_size()))
    parts = []
    for part in x.split(rows_per_part):
        columns = torch.cat([part[..., j * dilation: j * dilation + length] for j in range(k)], dim=1)
        parts.append(torch.matmul(flat_weight, columns))
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out if bias is None else out + bias[:, None]


class ShapeTunedConv1d(nn.Conv1d):
    """An unpadded, stride-1 Conv1d that runs cuDNN or conv1d_im2col, as timed per input shape."""

    TIMED_CALLS = 5
    IM2COL_MARGIN = 0.9  # im2col is chosen only below this fraction of cuDNN's time

    @classmethod
    def like(cls, conv: nn.Conv1d) -> "ShapeTunedConv1d":
        """The same convolution, sharing conv's parameters."""
        if conv.stride != (1,) or conv.padding != (0,) or conv.groups != 1:
            raise ValueError(f"only stride-1, unpadded, ungrouped convs are tuned, not {conv}")
        tuned = cls(conv.in_channels, conv.out_channels, conv.kernel_size, dilation=conv.dilation,
                    bias=conv.bias is not None, device="meta")
        tuned.weight, tuned.bias = conv.weight, conv.bias
        return tuned

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tuning = False
        self.im2col_for: dict[tuple, bool] = {}  # (input shape, dtype) -> whether im2col was faster

    def forward(self, x: Tensor) -> Tensor:
        return self.convolve(x, self.bias)

    def convolve(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """This convolution with `bias` instead of its own (None: without one)."""
        key = (tuple(x.shape), x.dtype)
        use_im2col = self.im2col_for.get(key)
        if use_im2col is None and self.tuning and x.is_cuda and not torch.cuda.is_current_stream_capturing():
            im2col_ms = self._milliseconds(lambda: conv1d_im2col(x, self.weight, bias, self.dilation[0]))
            cudnn_ms = self._milliseconds(lambda: self._conv_forward(x, self.weight, bias))
            use_im2col = self.im2col_for[key] = im2col_ms < self.IM2COL_MARGIN * cudnn_ms
        if use_im2col:
            return conv1d_im2col(x, self.weight, bias, self.dilation[0])
        return self._conv_forward(x, self.weight, bias)

    def _milliseconds(self, call) -> float:
        call()  # plans, workspaces
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.TIMED_CALLS):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def tune_convs(module: nn.Module) -> None:
    """Replace every unpadded, stride-1, ungrouped Conv1d of more than one tap inside `module` by a
    ShapeTunedConv1d sharing its weights."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is nn.Conv1d and child.kernel_size[0] > 1 and child.stride == (1,)
                    and child.padding == (0,) and child.groups == 1):
                setattr(parent, name, ShapeTunedConv1d.like(child))


@contextlib.contextmanager
def tuning(module: nn.Module):
    """Time the shapes that the tuned convs inside `module` see meanwhile (CUDA, outside graph capture)."""
    convs = [m for m in module.modules() if isinstance(m, ShapeTunedConv1d)]
    for conv in convs:
        conv.tuning = True
    try:
        yield
    finally:
        for conv in convs:
            conv.tuning = False
