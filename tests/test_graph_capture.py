"""GraphCapture (engine/runtime/graph_capture.py): what the engine captures before its first request,
with and without compile helpers, and in which order capture_more captures the rest."""

from __future__ import annotations

from engine.compile_helpers import CompileHelpers
from engine.runtime.graph_capture import GraphCapture


class Steps:
    """Stands in for the step runner: records what GraphCapture asks of it."""

    policy = type("Policy", (), {"cuda_graphs": True})()
    cache = type("Cache", (), {"n_slots": 4})()

    def __init__(self, calls: list, failing_batch: int | None = None):
        self.calls, self._failing_batch = calls, failing_batch
        self.pending_batches, self.ready_slots = [2, 4], 1

    def prepare(self, batch_sizes, prefill=True):
        self.calls.append(("steps", batch_sizes, prefill))
        if batch_sizes == [self._failing_batch]:
            raise RuntimeError("capture failed")
        if prefill is True and batch_sizes[0] in self.pending_batches:  # capture_more's call: a bucket captured
            self.pending_batches.remove(batch_sizes[0])
            self.ready_slots = batch_sizes[0]
        return 0.0

    def prepare_prefill(self):
        self.calls.append("prefill")

    def stop_capturing(self):
        self.pending_batches = []


class Helpers(CompileHelpers):
    """Helpers of the parts given, already done when waited for; records the waits."""

    def __init__(self, calls: list, parts: tuple[str, ...]):
        super().__init__()
        self.calls, self._parts = calls, list(parts)

    def running(self):
        return bool(self._parts)

    def wait(self, part):
        self.calls.append(("wait", part))
        if part in self._parts:
            self._parts.remove(part)

    def close(self):
        self.calls.append("close")


class Codec:
    """Stands in for the codec runner."""

    rows = 64

    def __init__(self, calls: list):
        self.calls = calls

    def prepare(self, up_to):
        self.calls.append(("codec", up_to))
        return 0.0


class Encoder:
    """Stands in for the reference encoder."""

    def __init__(self, calls: list, fails: bool = False):
        self.calls, self.fails, self.captured = calls, fails, False

    def prepare(self):
        self.calls.append("encoder")
        if self.fails:
            raise RuntimeError("capture failed")
        self.captured = True
        return 0.0


def graphs(calls: list, failing_batch: int | None = None, encoder_fails: bool = False) -> GraphCapture:
    return GraphCapture(Steps(calls, failing_batch), Codec(calls), Encoder(calls, encoder_fails))


def prepared(helpers: tuple[str, ...] | None, failing_batch: int | None = None) -> list:
    """What GraphCapture.prepare did, in order, with helpers of these parts (None: no helpers)."""
    calls: list = []
    graphs(calls, failing_batch).prepare(None if helpers is None else Helpers(calls, helpers))
    return calls


def test_with_helpers_the_engine_captures_the_steps_then_waits_for_each_part():
    assert prepared(("prefill", "codec")) == [
        ("steps", [1], False), ("steps", [2], False), ("wait", "prefill"), "prefill", ("wait", "codec"),
        ("codec", 2), "close"]


def test_without_helpers_the_engine_compiles_every_part_itself():
    assert prepared(None) == [("steps", [1], True), "prefill", ("codec", 2)]


def test_a_failed_capture_of_two_rows_still_waits_for_the_helpers(log_lines):
    calls = prepared(("prefill", "codec"), failing_batch=2)
    assert calls[2:] == [("wait", "prefill"), "prefill", ("wait", "codec"), ("codec", 2), "close"]
    assert any("capturing the graphs of batch 2 failed" in line for line in log_lines)


def test_a_helper_compiles_the_encoder_with_the_codec():
    calls: list = []
    graphs(calls).prepare_part("codec")
    assert calls == [("codec", 2), "encoder"]


def test_when_idle_the_encoder_is_the_first_unit_then_one_bucket_at_a_time():
    calls: list = []
    capture = graphs(calls)
    assert capture.pending
    assert capture.capture_more() is True and calls == ["encoder"]
    assert capture.capture_more() is True and calls[1:] == [("codec", 2), ("steps", [2], True)]
    assert capture.capture_more() is False and calls[3:] == [("codec", 4), ("steps", [4], True)]
    assert not capture.pending


def test_a_demand_for_rows_is_served_before_the_encoder_which_follows_in_the_same_drain():
    calls: list = []
    capture = graphs(calls)
    assert capture.capture_more(up_to=4) is False
    assert calls == [("codec", 2), ("steps", [2], True), ("codec", 4), ("steps", [4], True), "encoder"]


def test_the_encoder_waits_while_clips_are_encoding():
    calls: list = []
    capture = graphs(calls)
    capture.capture_more(up_to=2, encodes_idle=False)
    assert calls == [("codec", 2), ("steps", [2], True)] and capture.encoder_pending
    capture.capture_more(encodes_idle=False)
    assert calls[2:] == [("codec", 4), ("steps", [4], True)] and capture.encoder_pending
    capture.capture_more()
    assert calls[4:] == ["encoder"] and not capture.pending


def test_a_failed_encoder_capture_is_logged_once_and_leaves_the_batches(log_lines):
    calls: list = []
    capture = graphs(calls, encoder_fails=True)
    assert capture.capture_more() is True
    assert not capture.encoder_pending  # new clips encode eagerly from now on
    assert capture.capture_more() is True and capture.capture_more() is False
    assert calls == ["encoder", ("codec", 2), ("steps", [2], True), ("codec", 4), ("steps", [4], True)]
    assert sum("reference encoder's graphs failed" in line for line in log_lines) == 1


def test_without_cuda_graphs_nothing_is_pending():
    calls: list = []
    capture = graphs(calls)
    capture.steps.policy = type("Policy", (), {"cuda_graphs": False})()
    capture.steps.pending_batches = []
    assert not capture.pending and capture.capture_more() is False and calls == []


def test_a_failed_batch_capture_for_a_demand_still_captures_the_encoder(log_lines):
    calls: list = []
    capture = graphs(calls, failing_batch=2)
    assert capture.capture_more(up_to=2) is False
    assert calls == [("codec", 2), ("steps", [2], True), "encoder"]
    assert any("capturing the graphs of batch 2 failed" in line for line in log_lines)
