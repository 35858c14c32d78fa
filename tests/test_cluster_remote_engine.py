"""RemoteEngine's answer when Ray Serve refuses a call because the cluster is full: the API's 429 with
Retry-After, streaming or not. A stand-in handle refuses every call the way Serve's handle does
(the error comes on reading the call, and again on cancel()); no Ray cluster is started."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("ray.serve")

from ray.exceptions import RayTaskError  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402

from app.cluster.remote_engine import RemoteEngine  # noqa: E402
from app.errors import problem_for  # noqa: E402
from engine.errors import Cancelled, QueueFullError  # noqa: E402

pytestmark = pytest.mark.cluster
RETRY_S = 3


class RefusedCall:
    """A handle call Serve refused: reading it raises the error, and so does cancel()."""

    def __init__(self, error: Exception):
        self.error = error

    def __iter__(self):
        return self

    def __next__(self):
        raise self.error

    def result(self):
        raise self.error

    def cancel(self):
        raise self.error


class RefusingHandle:
    def __init__(self, error: Exception):
        self.error = error
        self.calls = 0
        self.synthesize = self.stream = self  # the replica's methods: `handle.stream.remote(...)`

    def options(self, **_):
        return self

    def remote(self, *args, **kwargs):
        self.calls += 1
        return RefusedCall(self.error)


def back_pressure(wrapped: bool) -> Exception:
    error = BackPressureError(num_queued_requests=8, max_queued_requests=8, status_code=429, retry_after_s=RETRY_S)
    return RayTaskError("stream", "traceback", error).as_instanceof_cause() if wrapped else error


@pytest.fixture(params=[False, True], ids=["bare", "wrapped"])
def engine(request):
    return RemoteEngine(RefusingHandle(back_pressure(request.param)), 44100, voices=None, view=None)


def assert_cluster_full(exc: BaseException):
    assert isinstance(exc, QueueFullError), repr(exc)
    problem = problem_for(exc)
    assert problem.status == 429 and "busy" in problem.message
    assert problem.headers == {"Retry-After": str(RETRY_S)}


def test_a_refused_stream_is_429_with_retry_after(engine):
    chunks = engine.synthesize_stream("Hello.", voice="alice")
    with pytest.raises(Exception) as raised:  # the stream's clean-up cancels the refused call
        next(chunks)
    assert_cluster_full(raised.value)


def test_a_refused_whole_request_is_429_with_retry_after(engine):
    with pytest.raises(Exception) as raised:
        engine.synthesize("Hello.")
    assert_cluster_full(raised.value)


def test_a_refused_batch_is_429_and_a_left_batch_cancels_refused_items_quietly(engine):
    with pytest.raises(Exception) as raised:
        engine.synthesize_batch(["One.", "Two."])
    assert_cluster_full(raised.value)
    stop = threading.Event()
    stop.set()
    results = engine.synthesize_batch(["One.", "Two."], stop=stop)
    assert [type(r) for r in results] == [Cancelled, Cancelled]
