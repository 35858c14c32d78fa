"""Our Triton kernels compiled ahead (engine/model/compile_ahead.py): which call a launch makes, on
stand-ins for Triton and a kernel (the GPU test in test_channels_last_decoder compiles real ones)."""

from types import SimpleNamespace

import pytest

from engine.model import compile_ahead


class RecordingKernel:
    """Records the launches and warmups asked of it, as a @triton.jit function takes them."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(("run", grid, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.calls.append(("warmup", grid, args, kwargs))


class RecordingAsyncMode:
    """Triton's AsyncCompileMode as far as compile_ahead uses it: entered with a pool, exited after."""

    def __init__(self, pool):
        self.pool = pool
        self.events = []
        RecordingAsyncMode.last = self

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, *exc):
        self.events.append("exit")


@pytest.fixture
def async_triton(monkeypatch):
    monkeypatch.setattr(compile_ahead, "triton", SimpleNamespace(AsyncCompileMode=RecordingAsyncMode))


def test_launches_run_the_kernel_outside_the_block_and_only_compile_inside(async_triton):
    kernel = RecordingKernel()
    compile_ahead.launch(kernel, (4, 1), "x", 3, block=16)
    with compile_ahead.compiling_ahead(workers=2) as ahead:
        assert ahead
        compile_ahead.launch(kernel, (4, 1), "x", 3, block=16)
    compile_ahead.launch(kernel, (2,), "y", block=8)
    assert kernel.calls == [("run", (4, 1), ("x", 3), {"block": 16}),
                            ("warmup", (4, 1), ("x", 3), {"block": 16}),
                            ("run", (2,), ("y",), {"block": 8})]
    assert RecordingAsyncMode.last.pool._max_workers == 2
    assert RecordingAsyncMode.last.events == ["enter", "exit"]


def test_a_block_inside_another_leaves_the_outer_one_in_charge(async_triton):
    """Triton allows one AsyncCompileMode at a time: the inner block opens none and compiles ahead
    through the outer one."""
    kernel = RecordingKernel()
    with compile_ahead.compiling_ahead(workers=1) as outer:
        outer_mode = RecordingAsyncMode.last
        with compile_ahead.compiling_ahead(workers=1) as inner:
            compile_ahead.launch(kernel, (1,), "x")
        compile_ahead.launch(kernel, (1,), "y")
    assert (outer, inner) == (True, False)
    assert RecordingAsyncMode.last is outer_mode and outer_mode.events == ["enter", "exit"]
    assert [call[0] for call in kernel.calls] == ["warmup", "warmup"]


def test_without_async_compiles_the_block_changes_nothing(monkeypatch):
    monkeypatch.setattr(compile_ahead, "triton", SimpleNamespace())  # a Triton before AsyncCompileMode
    kernel = RecordingKernel()
    with compile_ahead.compiling_ahead() as ahead:
        compile_ahead.launch(kernel, (1,), "x")
    assert not ahead and not compile_ahead.available()
    assert kernel.calls == [("run", (1,), ("x",), {})]


def test_an_error_inside_the_block_leaves_launches_running_kernels_again(async_triton):
    kernel = RecordingKernel()
    with pytest.raises(ValueError), compile_ahead.compiling_ahead(workers=1):
        raise ValueError("a bad call")
    compile_ahead.launch(kernel, (1,), "x")
    assert kernel.calls[0][0] == "run"
