"""Ray Serve scale-out on the CPU: `launch.py --replicas 2 --demo --device cpu --no-compile` started
for real (a local Ray cluster of two demo engine replicas behind the ingress) and called over HTTP.

Select with `-m cluster`; skipped when Ray Serve is not installed (requirements-ray.txt).
"""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("ray.serve")

from tests.test_app_support import ONE_FRAME_S, DemoServer, assert_audible, decode, error_message  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SLOTS = 2  # per replica (--max-batch-size), so that a few requests saturate one
QUEUE = 2  # per replica (S1_MINI_MAX_QUEUE): capacity 4 a replica, 8 the cluster
WAIT_S = 120  # bound on every wait below: nothing may hang
# Many sentences, so that a stream runs for many seconds (the demo model may end each text chunk early).
LONG_TEXT = "A long stream of words keeps the replica busy for a while. " * 30


class ClusterServer(DemoServer):
    start_timeout_s = 600  # a Ray cluster, then two engines, on two cores
    stop_timeout_s = 60  # Serve stops its replicas one by one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = {
        "S1_MINI_MAX_QUEUE": str(QUEUE),
        # Small Ray: no dashboard (the launcher turns it off), a small object store.
        "RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION": "0.01",
        "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(200 * 2**20),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Serve asks a replica its queue length before routing to it, within 0.1 s by default; a
        # replica that answers later on a loaded 2-core machine would be skipped, a spill the
        # routing tests would count.
        "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "2",
        "RAY_SERVE_MAX_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "5",
    }
    server = ClusterServer(tmp_path_factory.mktemp("cluster"), "--replicas", "2", "--device", "cpu", "--no-compile",
                           "--no-ui", "--max-batch-size", str(SLOTS), env=env)
    with server:
        with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
            wait_for(lambda: client.get("/ready").status_code == 200 and ready(client)["replicas_ready"] == 2,
                     "two replicas ready", server)
            yield server, client


def ready(client) -> dict:
    answer = client.get("/ready")
    return answer.json() if answer.status_code == 200 else {"replicas_ready": 0, "replicas": []}


def wait_for(condition, what: str, server, timeout_s: float = WAIT_S) -> None:
    """wait_until polling the cluster gently, with the server's log on failure."""
    wait_until(condition, what, timeout_s, poll_s=0.2, detail=server.log_tail)


def metric(client, name: str) -> dict[str, float]:
    """Samples of one metric from /metrics, by their label text ('' when unlabelled)."""
    found = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line[len(name):].rpartition(" ")
            found[labels] = float(value)
    return found


def replica_requests(client) -> dict[str, float]:
    return {labels.split('replica="')[1].split('"')[0]: value
            for labels, value in metric(client, "s1mini_replica_engine_requests").items()}


def holds_requests(replica: dict) -> bool:
    """Whether a replica's last report (every second) shows requests in its engine: decoding, or
    waiting (as a request does for a slot between its text chunks)."""
    return bool(replica.get("running") or replica.get("waiting"))


def generating_replica(client, server) -> dict:
    """/ready's entry of the one replica generating a request, once its report says so. Call it with
    the replicas idle before the request (wait_for_idle_replicas): a report from before would show
    another one."""
    holding = []

    def one_holding() -> bool:
        holding[:] = [r for r in ready(client)["replicas"] if holds_requests(r)]
        return len(holding) == 1

    wait_for(one_holding, "one replica reporting the request", server)
    return holding[0]


def wait_for_idle_replicas(client, server) -> None:
    """Until every replica's report shows its engine empty (the requests of earlier tests finished
    or cancelled)."""
    wait_for(lambda: not any(holds_requests(r) for r in ready(client)["replicas"]), "every replica idle", server)


def settled_replica_requests(client) -> dict[str, float]:
    """replica_requests once the replicas' reports (every second) have caught up with earlier requests."""
    previous = replica_requests(client)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(2.5)  # past two report periods
        current = replica_requests(client)
        if current == previous:
            return current
        previous = current
    raise AssertionError("the replicas' request counts kept changing")


def speak(client, **fields) -> httpx.Response:
    return client.post("/v1/tts", json={"text": "Hello there, cluster.", "format": "wav", "max_new_tokens": 24,
                                        "seed": 1, **fields})


def reference_wav(seed: int) -> bytes:
    """Two seconds of a tone in noise: audio the voice store accepts (the demo model speaks noise anyway)."""
    rng = np.random.default_rng(seed)
    t = np.arange(2 * 22050) / 22050
    samples = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)
    out = io.BytesIO()
    sf.write(out, samples.astype(np.float32), 22050, format="WAV", subtype="PCM_16")
    return out.getvalue()


def add_voice(client, voice_id: str, seed: int = 3):
    data = reference_wav(seed)
    answer = client.post("/v1/references/add", data={"id": voice_id, "text": "Some words of the reference."},
                         files={"audio": ("ref.wav", data, "audio/wav")})
    assert answer.status_code == 200, answer.text


def test_ready_lists_both_replicas_and_their_slots(cluster):
    _, client = cluster
    answer = ready(client)
    assert answer["status"] == "ready" and answer["replicas_ready"] == 2
    assert answer["slots"] == 2 * SLOTS
    assert {r["device"] for r in answer["replicas"]} == {"cpu"}
    assert len({r["replica"] for r in answer["replicas"]}) == 2


def test_concurrent_requests_all_succeed_on_both_replicas(cluster):
    server, client = cluster
    before = replica_requests(client)
    requests = 6  # within the cluster's 8 places
    with ThreadPoolExecutor(requests) as pool:
        answers = list(pool.map(lambda i: speak(client, seed=i), range(requests)))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        samples, rate = decode(answer.content)
        assert_audible(samples, ONE_FRAME_S, rate)

    def both_served():
        after = replica_requests(client)
        served = {r: after.get(r, 0) - before.get(r, 0) for r in after}
        return sum(served.values()) >= requests and all(n > 0 for n in served.values()) and len(served) == 2

    wait_for(both_served, "both replicas' engines counting the requests", server)


def test_one_voice_stays_on_one_replica_until_it_is_saturated(cluster):
    server, client = cluster
    add_voice(client, "steady")
    counts = metric(client, "s1mini_voice_routing_total")
    before = settled_replica_requests(client)
    for i in range(4):  # one after another: the preferred replica always has free slots
        answer = speak(client, reference_id="steady", seed=i)
        assert answer.status_code == 200, answer.text
    after_counts = metric(client, "s1mini_voice_routing_total")
    assert after_counts['{outcome="hit"}'] - counts['{outcome="hit"}'] == 4
    assert after_counts['{outcome="spill"}'] == counts['{outcome="spill"}']

    def on_one_replica():
        after = replica_requests(client)
        served = sorted(after.get(r, 0) - before.get(r, 0) for r in after)
        return served == [0, 4]

    wait_for(on_one_replica, "the four requests counted on one replica", server)
    assert metric(client, "s1mini_voice_routing_hit_ratio")[""] > 0


def test_a_saved_voice_is_usable_from_every_replica_and_renames_reach_them(cluster):
    """More requests for one voice at once than its replica has slots: those past its slots go to
    the other replica, which reads the voice from the shared folder; a rename and a delete are seen
    by both at once."""
    _, client = cluster
    add_voice(client, "shared voice")
    counts = metric(client, "s1mini_voice_routing_total")
    # Past one replica's slots, so some spill, and within the cluster's places (each replica takes its
    # slots plus its queue; beyond that Serve queues, then refuses: test_a_full_cluster_answers_429_with_retry_after).
    burst = 3 * SLOTS
    with ThreadPoolExecutor(burst) as pool:
        answers = list(pool.map(lambda i: speak(client, reference_id="shared voice", seed=i, max_new_tokens=64),
                                range(burst)))
    assert [a.status_code for a in answers] == [200] * burst, [a.text for a in answers if a.status_code != 200]
    for answer in answers:
        samples, rate = decode(answer.content)
        assert_audible(samples, ONE_FRAME_S, rate)
    after = metric(client, "s1mini_voice_routing_total")
    assert after['{outcome="spill"}'] > counts['{outcome="spill"}'], "no request went past the busy replica"
    assert after['{outcome="hit"}'] > counts['{outcome="hit"}']

    renamed = client.post("/v1/references/update",
                          json={"old_reference_id": "shared voice", "new_reference_id": "renamed voice"})
    assert renamed.status_code == 200, renamed.text
    with ThreadPoolExecutor(burst) as pool:
        answers = list(pool.map(lambda i: speak(client, reference_id="renamed voice", seed=i), range(burst)))
    assert [a.status_code for a in answers] == [200] * burst
    assert speak(client, reference_id="shared voice").status_code == 404
    deleted = client.request("DELETE", "/v1/references/delete", json={"reference_id": "renamed voice"})
    assert deleted.status_code == 200
    assert speak(client, reference_id="renamed voice").status_code == 404


def engines_full(client) -> bool:
    """Every replica's engine reports its slots running and its queue full."""
    replicas = ready(client)["replicas"]
    return len(replicas) == 2 and all(r["running"] == SLOTS and r["waiting"] == QUEUE for r in replicas)


def assert_cluster_full(answer: httpx.Response):
    assert answer.status_code == 429, (answer.status_code, answer.text)
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.headers["content-type"] == "application/json"
    assert "busy" in error_message(answer)


def test_a_full_cluster_answers_429_with_retry_after(cluster):
    """Long streams take every place on the replicas (slots and engine queues). Serve's queue then holds
    a cluster's worth of requests more (the replicas' places again); past it every request, streaming
    or not, gets the API's 429 with Retry-After at once. Once the long streams stop, the requests that
    waited in Serve's queue are served."""
    server, client = cluster
    places = 2 * (SLOTS + QUEUE)
    release = threading.Event()
    held: list[int] = []
    ended_early: list[int] = []

    def hold(i):
        body = {"text": LONG_TEXT, "format": "wav", "streaming": True, "max_new_tokens": 4000, "seed": i}
        with client.stream("POST", "/v1/tts", json=body) as stream:
            held.append(stream.status_code)
            for _ in stream.iter_bytes():
                if release.is_set():
                    return  # leaving the stream cancels its request
            ended_early.append(i)

    with ThreadPoolExecutor(places) as holding, ThreadPoolExecutor(places + 2) as pool:
        holds = [holding.submit(hold, i) for i in range(places)]
        try:
            wait_for(lambda: engines_full(client), "every replica's slots and queue taken", server)
            # Serve's queue takes `places` of these; the two it has no room for are refused at once.
            burst = [pool.submit(speak, client, seed=i, streaming=True) for i in range(places + 2)]
            wait_for(lambda: sum(f.done() for f in burst) >= 2, "two requests past Serve's queue answered", server)
            refused = [f.result() for f in burst if f.done()]
            # With Serve's queue full, whole requests are refused too, on both APIs.
            whole = speak(client, streaming=False)
            openai = client.post("/v1/audio/speech", json={"input": "Hello there, cluster.", "max_new_tokens": 24})
            assert not ended_early, "a long stream ended before the cluster was full: make LONG_TEXT longer"
        finally:
            release.set()
        answers = [f.result() for f in burst]
        for future in holds:
            future.result()
    assert held == [200] * places

    for answer in [*refused, whole]:
        assert_cluster_full(answer)
    assert openai.status_code == 429 and int(openai.headers["retry-after"]) >= 1, openai.text
    assert "busy" in error_message(openai)
    statuses = [a.status_code for a in answers]
    assert sorted(statuses) == [200] * places + [429] * 2, statuses
    for answer in answers:
        if answer.status_code == 200:  # waited in Serve's queue, served once the long streams stopped
            samples, rate = decode(answer.content)
            assert_audible(samples, ONE_FRAME_S, rate)


def test_streams_through_serve_and_a_killed_replica_is_replaced(cluster):
    """A stream's first audio arrives while its replica still generates; killing that replica ends
    the stream with an error (not a clean end), the other replica keeps answering, Serve starts a
    new replica and /ready shows it."""
    server, client = cluster
    add_voice(client, "doomed")
    wait_for_idle_replicas(client, server)
    body = {"text": LONG_TEXT, "format": "wav", "streaming": True, "max_new_tokens": 4000, "reference_id": "doomed"}
    with client.stream("POST", "/v1/tts", json=body) as stream:
        assert stream.status_code == 200
        chunks = stream.iter_bytes()
        assert next(chunks)[:4] == b"RIFF"  # audio is flowing: the replica is generating the rest
        victim = generating_replica(client, server)
        victim_id = victim["replica"]
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            for _ in chunks:
                pass

    answer = speak(client)  # the other replica answers meanwhile
    assert answer.status_code == 200, answer.text

    def replaced():
        replicas = {r["replica"] for r in ready(client)["replicas"]}
        return len(replicas) == 2 and victim_id not in replicas

    wait_for(replaced, "Serve replacing the killed replica", server, timeout_s=240)
    assert speak(client).status_code == 200
