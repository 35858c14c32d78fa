"""The decode step's bookkeeping kernel against decode_step.record_frame's plain ops (CUDA with Triton only)."""

import copy

import pytest
import torch

from engine.runtime.decode_step import DecodeState, record_frame

pytestmark = pytest.mark.gpu
record_kernel = None  # engine.runtime.record_kernel, imported once a test runs: it needs Triton, which a CPU machine may lack


@pytest.fixture(scope="module", autouse=True)
def triton_module():
    global record_kernel
    record_kernel = pytest.importorskip("engine.runtime.record_kernel", reason="needs Triton")

IM_END = 4099


def states(seed: int, batch: int = 5, codebooks: int = 10, capacity: int = 64):
    """A decode state with an idle last slot, a row already done, histories that wrap around."""
    g = torch.Generator().manual_seed(seed)
    state = DecodeState.allocate(batch, codebooks, capacity, "cuda")
    for slot in range(batch - 1):
        state.start(slot, torch.randint(0, 4096, (codebooks + 1,), generator=g).cuda(), 20 + slot, 0.7, 0.8, 1.1, slot)
    state.history.generated.copy_(torch.randint(0, 40, (batch,), generator=g).cuda() * state.active)
    state.done[1] = True
    state.length.copy_(torch.randint(0, 30, (batch,), generator=g).cuda())
    frames = [torch.randint(0, 4096, (batch, codebooks + 1), generator=g).cuda() for _ in range(3)]
    frames[1][2, 0] = IM_END  # row 2 ends at the second frame
    return state, frames


def assert_same_state(got: DecodeState, expected: DecodeState):
    for name in ("columns", "positions", "frames", "done", "length", "active"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert torch.equal(got.history.ids, expected.history.ids)
    assert torch.equal(got.history.generated, expected.history.generated)


@pytest.mark.parametrize("seed", range(4))
def test_the_kernel_leaves_the_state_as_record_frame_does(seed):
    state, frames = states(seed)
    expected = copy.deepcopy(state)
    for frame in frames:
        record_frame(expected, frame, IM_END)
        h = state.history
        record_kernel.record_rows(frame, state.active, h.ids, h.generated, state.frames, state.done, state.length,
                                  state.columns, state.positions, IM_END)
        assert_same_state(state, expected)
    assert state.done.tolist()[1:3] == [True, True]


@torch.inference_mode()
def test_compiled_record_frame_in_a_cuda_graph_takes_the_kernel_and_equals_the_plain_ops(monkeypatch):
    """As the step runner compiles it (its own region, fullgraph) and captures it: replayed frame after
    frame, the state equals the plain ops', and the kernel is what ran."""
    from engine.runtime import decode_step

    calls = []
    monkeypatch.setattr(decode_step, "record_kernel", type("Traced", (), {
        "record_rows": staticmethod(lambda *args: calls.append(1) or record_kernel.record_rows(*args))}))
    state, frames = states(7)
    expected = copy.deepcopy(state)
    frame = frames[0].clone()
    compiled = torch.compile(decode_step.record_frame, fullgraph=True)
    compiled(copy.deepcopy(state), frame, IM_END)  # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compiled(state, frame, IM_END)
    assert calls
    for new in frames:
        frame.copy_(new)  # each replay reads the frame there
        graph.replay()
        record_frame(expected, new, IM_END)
        assert_same_state(state, expected)
