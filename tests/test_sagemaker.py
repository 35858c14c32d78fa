"""Amazon SageMaker's container contract over real HTTP: GET /ping (503 before the model is ready,
200 after), POST /invocations (JSON or msgpack body, the Accept header picks the format, 4xx for bad
input), the same auth as every other route, and `serve` mode (port 8080 or SAGEMAKER_BIND_TO_PORT,
the model from /opt/ml/model, in-flight requests finished on SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import ormsgpack
import pytest
import uvicorn

from app import launcher
from app.routes_sagemaker import format_from_accept
from app.server import create_app
from app.settings import AppSettings
from app.errors import HTTPProblem
from engine.voice_store import VoiceStore
from tests.test_app_support import FAST, ROOT, SAMPLE_RATE, DemoServer, assert_audio, decode_pcm16, error_message, free_port
from tests.waiting import wait_until

KEY = "sagemaker-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"text": "Hello from SageMaker.", **FAST}


# ---- the Accept header ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "accept, expected",
    [
        (None, "flac"),
        ("", "flac"),
        ("*/*", "flac"),
        ("audio/*", "flac"),
        ("application/octet-stream", "flac"),
        ("audio/wav", "wav"),
        ("audio/x-wav", "wav"),
        ("audio/mpeg", "mp3"),
        ("audio/ogg; codecs=opus", "opus"),
        ("audio/pcm", "pcm"),
        ("text/html, audio/mpeg", "mp3"),  # the first one this server writes
        ("audio/wav;q=0.5, audio/mpeg", "mp3"),  # by quality before order
        ("audio/wav;q=0, */*;q=0.1", "flac"),  # q=0 means "not this one"
    ],
)
def test_the_accept_header_picks_the_format(accept, expected):
    assert format_from_accept(accept, "flac") == expected


@pytest.mark.parametrize("accept", ["text/html", "application/json", "audio/aiff", "audio/wav;q=0"])
def test_an_accept_header_naming_no_audio_format_is_406(accept):
    with pytest.raises(HTTPProblem) as caught:
        format_from_accept(accept, "wav")
    assert caught.value.status == 406 and "audio/mpeg" in caught.value.message


# ---- a real server -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with DemoServer(tmp_path_factory.mktemp("sagemaker"), "--no-ui", "--api-key", KEY) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def test_ping_is_200_once_ready_with_the_same_auth_as_other_routes(http):
    assert http.get("/ping").status_code == 401
    assert http.get("/ready").status_code == 401  # the same guard
    r = http.get("/ping", headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "ready"


def test_invocations_needs_the_key_too(http):
    r = http.post("/invocations", json=BODY)
    assert r.status_code == 401 and "Bearer" in error_message(r)


@pytest.mark.parametrize(
    "accept, mime, rate",
    [(None, "audio/wav", SAMPLE_RATE), ("audio/wav", "audio/wav", SAMPLE_RATE), ("audio/mpeg", "audio/mpeg", SAMPLE_RATE),
     ("audio/flac", "audio/flac", SAMPLE_RATE), ("audio/ogg", "audio/ogg", 48000)],
)
def test_invocations_answers_the_format_accept_asks_for(http, accept, mime, rate):
    headers = {**AUTH, **({"Accept": accept} if accept else {})}
    r = http.post("/invocations", json=BODY, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(mime)
    assert_audio(r.content, rate=rate)


def test_invocations_takes_msgpack_like_v1_tts(http):
    headers = {**AUTH, "Content-Type": "application/msgpack", "Accept": "audio/pcm"}
    r = http.post("/invocations", content=ormsgpack.packb({**BODY, "seed": 3}), headers=headers)
    assert r.status_code == 200, r.text
    pcm = decode_pcm16(r.content)
    # The same request through /v1/tts gives the same samples: one body, one engine path.
    same = http.post("/v1/tts", json={**BODY, "seed": 3, "format": "pcm"}, headers=AUTH)
    assert same.status_code == 200 and decode_pcm16(same.content).tolist() == pcm.tolist()


def test_streaming_invocations_send_the_same_samples_as_the_whole_clip(http):
    headers = {**AUTH, "Accept": "audio/pcm"}
    whole = http.post("/invocations", json={**BODY, "seed": 4}, headers=headers)
    with http.stream("POST", "/invocations", json={**BODY, "seed": 4, "streaming": True}, headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("audio/pcm")
        streamed = b"".join(r.iter_bytes())
    assert whole.status_code == 200 and streamed == whole.content and len(streamed) > 0


def test_without_accept_the_body_format_is_used(http):
    r = http.post("/invocations", json={**BODY, "format": "flac"}, headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("audio/flac")
    assert_audio(r.content)


@pytest.mark.parametrize(
    "kwargs, status, words",
    [
        ({"json": BODY, "headers": {"Accept": "text/html"}}, 406, "Accept one of"),
        ({"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "not valid JSON"),
        ({"content": b"\xc1", "headers": {"Content-Type": "application/msgpack"}}, 400, "not valid msgpack"),
        ({"json": {"max_new_tokens": 8}}, 422, "text"),
        ({"json": {**BODY, "temperature": 7}}, 422, "temperature"),
        ({"content": b"hello", "headers": {"Content-Type": "text/plain"}}, 415, "application/json"),
    ],
)
def test_bad_invocations_are_clear_4xx(http, kwargs, status, words):
    headers = {**AUTH, **kwargs.pop("headers", {})}
    r = http.post("/invocations", headers=headers, **kwargs)
    assert r.status_code == status, r.text
    assert words in error_message(r)


# ---- before the model is ready -------------------------------------------------------------------


class LoadingEngine:
    """Just enough of TTSEngine for the app, still loading: is_ready is False until the test says."""

    sample_rate = SAMPLE_RATE
    is_ready = False
    slots = slots_ready = 1
    capturing = False
    in_flight = 0

    def __init__(self, voices_dir):
        self.voices = VoiceStore(voices_dir)

    def stats(self) -> dict:
        return {"model": "stand-in", "device": "cpu", "precision": "fp32", "compile": "off", "demo": False}


def test_ping_is_503_with_retry_after_until_the_model_is_ready(tmp_path):
    engine = LoadingEngine(tmp_path)
    port = free_port()
    config = uvicorn.Config(create_app(engine, AppSettings(ui=False)), host="127.0.0.1", port=port, log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}/ping"
        wait_until(lambda: server.started, "uvicorn listening")
        r = httpx.get(url, timeout=5)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "loading" in error_message(r)
        engine.is_ready = True
        assert httpx.get(url, timeout=5).status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# ---- serve mode ----------------------------------------------------------------------------------


def parse(*argv):
    return launcher.build_parser().parse_args(list(argv))


def test_serve_mode_listens_on_8080_for_every_address_without_the_ui():
    plan = launcher.plan_server(parse("serve"), {})
    assert (plan.host, plan.port, plan.ui) == ("0.0.0.0", 8080, False)
    assert plan.drain_s == launcher.SERVE_DRAIN_S < 30  # inside SageMaker's SIGTERM-to-SIGKILL window
    assert launcher.plan_server(parse("serve"), {"SAGEMAKER_BIND_TO_PORT": "9000"}).port == 9000
    assert launcher.plan_server(parse("serve", "--listen", "127.0.0.1:7000"), {}).port == 7000
    assert launcher.plan_server(parse(), {}).drain_s == launcher.DRAIN_S
    assert launcher.plan_server(parse("--drain-seconds", "12"), {}).drain_s == 12
    with pytest.raises(ValueError, match="drain-seconds"):
        launcher.plan_server(parse(), {"S1_MINI_DRAIN_SECONDS": "-1"})


def test_serve_mode_loads_the_model_sagemaker_extracted(tmp_path):
    model_dir = tmp_path / "model"
    assert launcher.sagemaker_model_dir(parse("serve"), {}, str(model_dir)) is None  # not there
    model_dir.mkdir()
    assert launcher.sagemaker_model_dir(parse("serve"), {}, str(model_dir)) is None  # empty
    (model_dir / "model.pth").write_bytes(b"weights")
    assert launcher.sagemaker_model_dir(parse("serve"), {}, str(model_dir)) == str(model_dir)
    assert launcher.sagemaker_model_dir(parse(), {}, str(model_dir)) is None  # only in serve mode
    assert launcher.sagemaker_model_dir(parse("serve", "--checkpoint", "x"), {}, str(model_dir)) is None
    assert launcher.sagemaker_model_dir(parse("serve"), {"S1_MINI_CHECKPOINT": "x"}, str(model_dir)) is None
    assert launcher.sagemaker_model_dir(parse("serve", "--demo"), {}, str(model_dir)) is None
    assert launcher.sagemaker_model_dir(parse("serve"), {"S1_MINI_DEMO": "1"}, str(model_dir)) is None


def test_serve_mode_finishes_the_request_in_flight_on_sigterm(tmp_path):
    """As SageMaker stops a container: SIGTERM while a clip streams; the clip still arrives whole,
    new connections are refused, and the process exits cleanly."""
    port = free_port()
    env = {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port), "HF_HUB_OFFLINE": "1",
           "S1_MINI_VOICES_DIR": str(tmp_path / "voices"), "S1_MINI_CACHE_DIR": str(tmp_path / "cache")}
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen([sys.executable, "launch.py", "serve", "--demo"], cwd=ROOT, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if process.poll() is not None:
                break
            try:
                if httpx.get(url + "/ping", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                threading.Event().wait(0.5)
        assert httpx.get(url + "/ping", timeout=5).status_code == 200, (tmp_path / "serve.log").read_text()[-3000:]
        assert httpx.get(url + "/", timeout=5).status_code in (302, 307)  # no UI: / points at the docs
        body = {"text": "A longer sentence, so that it is still being spoken when the stop comes.",
                "max_new_tokens": 32, "seed": 1, "format": "pcm"}
        whole = httpx.post(url + "/v1/tts", json=body, timeout=120).content  # the same clip, undisturbed
        with httpx.stream("POST", url + "/v1/tts", json={**body, "streaming": True}, timeout=120) as r:
            chunks = r.iter_bytes()
            received = [next(chunks)]  # the request is in flight
            process.send_signal(signal.SIGTERM)
            received.extend(chunks)
        assert len(received) > 1 and b"".join(received) == whole
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=5)
        # uvicorn re-raises the signal once it has shut down, so the exit status says "stopped by SIGTERM".
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert "serve mode" in text and "Finished server process" in text and "Traceback" not in text


def test_the_container_healthcheck_finds_the_server_on_its_port(server):
    from app import healthcheck

    port = server.url.rpartition(":")[2]
    assert healthcheck.ports({"S1_MINI_LISTEN": f"0.0.0.0:{port}"}) == [port, "7860", "8080"]
    assert healthcheck.ports({"SAGEMAKER_BIND_TO_PORT": "9000"}) == ["9000", "7860", "8080"]
    server = ["/opt/venv/bin/python3", "/opt/venv/bin/s1-mini-studio", "--demo", "--listen", "0.0.0.0:9100"]
    assert healthcheck.ports({"S1_MINI_LISTEN": ":9200"}, server) == ["9100", "9200", "7860", "8080"]
    assert healthcheck.ports({}, ["s1-mini-studio", "--listen=:9300"]) == ["9300", "7860", "8080"]
    assert healthcheck.ports({}, ["s1-mini-studio", "--listen"]) == ["7860", "8080"]  # refused by the server anyway
    env = {**os.environ, "S1_MINI_LISTEN": f"0.0.0.0:{port}"}
    assert subprocess.run([sys.executable, "-m", "app.healthcheck"], cwd=ROOT, env=env, timeout=60).returncode == 0
    env["S1_MINI_LISTEN"] = f"0.0.0.0:{free_port()}"  # nothing there (nor, here, on 7860 or 8080, normally)
    assert not healthcheck.healthy(env["S1_MINI_LISTEN"].rpartition(":")[2])
