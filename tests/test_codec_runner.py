"""CodecRunner's graph bookkeeping on the CPU: CUDA graph capture replaced by a stand-in whose replay
runs the captured body again into the same output buffer. What it checks is the runner's own logic
(which rows a replay touches, the spare row that absorbs a bucket's padding, what a graph needs kept
alive); tests/test_gpu.py replays the real graphs."""

import gc
import types

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import engine.runtime.codec_runner as codec_runner
from engine.config import EngineConfig
from engine.loader import load_models
from engine.model.codec_stream import StreamingDecoder
from engine.runtime.decode_loop import Harvest
from engine.runtime.scheduler import BLOCK_SIZES
from engine.runtime.step_runner import bucket_for


class ReadsFromOutside(TorchDispatchMode):
    """The storages a body's ops read that the body did not make (what a CUDA graph reads by address)."""

    def __init__(self):
        super().__init__()
        self.made, self.read = set(), {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for arg in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(arg, torch.Tensor) and arg.numel() and arg.untyped_storage().data_ptr() not in self.made:
                self.read.setdefault(arg.untyped_storage().data_ptr(), f"{func} {tuple(arg.shape)}")
        out = func(*args, **(kwargs or {}))
        self.made.update(o.untyped_storage().data_ptr() for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor))
        return out


class ReplayedBody:
    def __init__(self, body, output: torch.Tensor, reads: ReadsFromOutside):
        self.body, self.output, self.reads = body, output, reads

    def replay(self) -> None:
        self.output.copy_(self.body())

    def pool(self):
        return None


def capture_by_replaying(fn, stream, pool=None):
    with ReadsFromOutside() as reads:
        output = fn().clone()
    return ReplayedBody(fn, output, reads), output


def storages_reachable(root) -> set[int]:
    """Storages reachable from root other than through a stand-in graph or a function's closure: a
    real CUDA graph holds no Python reference to what it reads."""
    seen, found, pending = set(), set(), [root]
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, (ReplayedBody, types.FunctionType, types.ModuleType, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.numel():
                found.add(obj.untyped_storage().data_ptr())
            continue
        pending.extend(gc.get_referents(obj))
    return found


@pytest.fixture(scope="module")
def codec():
    return load_models(EngineConfig(demo=True, device="cpu")).codec


@pytest.fixture
def runner(codec, monkeypatch):
    monkeypatch.setattr(codec_runner, "capture", capture_by_replaying)
    runner = codec_runner.CodecRunner(codec, rows=8, max_frames=256)
    runner.prepare()
    assert runner._graphs, "the stand-in should have been captured for every bucket and length"
    return runner


def test_row_buckets_are_powers_of_two_and_the_sizes_halfway():
    assert codec_runner.codec_row_buckets(1) == [1]
    assert codec_runner.codec_row_buckets(4) == [1, 2, 3, 4]
    assert codec_runner.codec_row_buckets(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert codec_runner.codec_row_buckets(40) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40]
    for rows in range(1, 200):  # a call of r rows pads to at most 1.5 r (+1 for the smallest)
        buckets = codec_runner.codec_row_buckets(rows)
        assert buckets[-1] == rows and buckets == sorted(set(buckets))
        assert all(bucket_for(r, buckets) <= 1.5 * r + 1 for r in range(1, rows + 1))


def test_prepare_captures_the_buckets_up_to_a_batch_once(codec, monkeypatch):
    monkeypatch.setattr(codec_runner, "capture", capture_by_replaying)
    runner = codec_runner.CodecRunner(codec, rows=8, max_frames=64)
    runner.prepare(1)
    assert {bucket for bucket, _ in runner._graphs} == {1}
    first = dict(runner._graphs)
    runner.prepare(4)  # the step's batch bucket 4: codec buckets 2, 3 and 4 join
    assert {bucket for bucket, _ in runner._graphs} == {1, 2, 3, 4}
    assert all(runner._graphs[key] is graph for key, graph in first.items())  # none captured again
    runner.prepare()
    assert {bucket for bucket, _ in runner._graphs} == {1, 2, 3, 4, 6, 8}
    assert len(runner._graphs) == 6 * len(BLOCK_SIZES)


def test_padded_replays_leave_real_streams_alone_and_the_spare_row_bounded(runner, codec):
    """Five streams in a bucket of six, twelve 16-frame chunks: every replay has one padded row on
    the spare stream. Unless each replay resets the spare row, its position grows by 16 a replay until
    the RoPE gather runs past the table (a device assert under sustained load)."""
    gen = torch.Generator().manual_seed(0)
    streams = [torch.cat([torch.randint(0, 4096, (1, 192), generator=gen),
                          torch.randint(0, 1024, (9, 192), generator=gen)]) for _ in range(5)]
    pieces = [[] for _ in streams]
    with torch.inference_mode():
        for call in range(12):
            chunk = slice(16 * call, 16 * (call + 1))
            runner.submit([Harvest(slot, slot, codes[:, chunk], first=call == 0, final=False)
                           for slot, codes in enumerate(streams)])
            while runner.pending:
                for item in runner.completed(wait=True):
                    pieces[item.owner].append(item.audio)
        positions = runner.decoder.positions.tolist()
        assert positions[:5] == [192] * 5
        assert positions[runner.rows] <= 16, positions
        for slot, codes in enumerate(streams):
            lone = StreamingDecoder(codec)
            alone = np.concatenate([lone.decode(codes[None, :, 16 * c:16 * (c + 1)])[0, 0].numpy() for c in range(12)])
            np.testing.assert_allclose(np.concatenate(pieces[slot]), alone, atol=1e-4 * np.abs(alone).max())


def test_a_read_back_that_fails_leaves_every_call_pending_for_discard(runner):
    """Two calls decoded; reading the second one's audio back fails: nothing is taken off, so the
    caller's `discard` names every owner (the first's audio, read but never returned, included)."""
    codes = torch.randint(0, 1024, (10, 8))
    with torch.inference_mode():
        runner.submit([Harvest("first", 0, codes, first=True, final=False)])
        runner.submit([Harvest("second", 1, codes, first=True, final=False)])

    class Unreadable:
        def numpy(self):
            raise RuntimeError("read-back broke")

    runner._pending[1].outputs = [(indices, Unreadable()) for indices, _ in runner._pending[1].outputs]
    with pytest.raises(RuntimeError, match="read-back broke"):
        runner.completed(wait=True)
    assert runner.pending and runner.discard() == ["first", "second"]


def test_every_tensor_a_graph_reads_is_kept_by_the_runner(runner):
    """A graph reads its inputs by address. One reachable only from the captured body (the spare
    row's index, say) is freed after the capture, and its memory reused: the reset would then zero
    whatever rows that memory names."""
    gc.collect()
    kept = storages_reachable(runner)
    graphs = [entry.graph for entry in runner._graphs.values()]
    lost = {ptr: what for g in graphs for ptr, what in g.reads.read.items() if ptr not in kept}
    assert graphs and all(g.reads.read for g in graphs)
    assert not lost, f"read by a graph but not kept: {sorted(lost.values())}"
