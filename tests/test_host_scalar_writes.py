"""No host scalar is written into a tensor on the decode loop's path. On CUDA `tensor[i] = 0`
copies a host scalar into the device tensor, and that copy waits for every kernel queued on the
stream (the steps the worker keeps ahead of the GPU), after which the GPU idles while the host
works (~5 ms at each retirement of a 64-stream run). Fills on the device do not wait.
On the CPU the same writes show as a tensor lifted from Python values and copied into another,
which this mode catches (from torch 2.15 `tensor[i] = 0` is a fill instead, no copy); tests/test_gpu.py
checks the CUDA path with torch's sync debug mode."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.runtime import sampling
from engine.runtime.decode_step import DecodeState
from test_decode_loop import model, scheduler_for, specs  # noqa: F401  (fixtures)
from scheduling import Collector, run_until_idle


class HostScalarWrites(TorchDispatchMode):
    """Records every copy into a tensor from a tensor lifted from Python values (a scalar written
    with `t[i] = 0`, or `t.copy_(torch.tensor([...]))`)."""

    def __init__(self):
        super().__init__()
        self.lifted: dict[int, torch.Tensor] = {}  # held, so that no other tensor takes a recorded id
        self.writes: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.lift_fresh.default:
            self.lifted[id(out)] = out
        elif func is torch.ops.aten.copy_.default and self.lifted.get(id(args[1])) is args[1]:
            self.writes.append(f"{tuple(args[0].shape)} <- {args[1].tolist()!r}")
        return out


def test_the_mode_catches_host_values_copied_into_a_tensor():
    x = torch.zeros(4)
    with HostScalarWrites() as mode:
        x[1] = torch.tensor(3.0)
        x[2:].copy_(torch.tensor([1.0, 2.0]))
        x[:2].fill_(1.0)
    assert mode.writes == ["() <- 3.0", "(2,) <- [1.0, 2.0]"]


def test_a_run_with_retirements_and_a_cancellation_writes_no_host_scalar(model, specs):  # noqa: F811
    scheduler = scheduler_for(model, 2)
    owners = [Collector() for _ in range(3)]
    for spec, owner in zip(specs[:3], owners):
        scheduler.submit(spec, owner)

    def cancel(i):
        owners[1].cancelled = i >= 6

    with HostScalarWrites() as mode:
        run_until_idle(scheduler, cancel)
    assert mode.writes == []
    assert owners[0].finished and owners[2].finished and owners[1].error is not None


def test_stopping_a_slot_and_sorted_top_p_write_no_host_scalar():
    state = DecodeState.allocate(3, 10, 16, "cpu")
    state.active.fill_(1)
    state.positions.fill_(7)
    logits = torch.randn(2, 50)
    with HostScalarWrites() as mode:
        state.stop(1)
        removed = sampling.outside_nucleus_sorted(logits, torch.tensor([[0.5], [1e-6]]))
    assert mode.writes == []
    assert state.active.tolist() == [1, 0, 1] and state.positions.tolist() == [7, 0, 7]
    assert not removed[torch.arange(2), logits.argmax(-1)].any()  # the top token always stays


def test_the_exact_heads_padding_mask_writes_no_host_scalar(model):  # noqa: F811
    from engine.runtime.frame_sampler import FullVocabHead

    head = FullVocabHead(model)
    hidden = torch.randn(2, 1, model.config.dim)
    with HostScalarWrites() as mode, torch.inference_mode():
        logits = head.logits(hidden)
    assert mode.writes == []
    assert torch.isinf(logits[:, head.first_padding_id:]).all() and torch.isfinite(logits[:, :head.first_padding_id]).all()
