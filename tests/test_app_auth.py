"""--api-key: every route but /health needs the Bearer key, the UI needs it as a login password;
and a full engine queue answers 429 with Retry-After. Against `launch.py --demo --api-key`."""

from __future__ import annotations

import threading

import httpx
import ormsgpack
import pytest
from gradio_client import Client
from gradio_client.exceptions import AuthenticationError
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.test_app_support import FAST, DemoServer, assert_audio, error_message

KEY = "test-key-123"
GOOD = {"authorization": f"Bearer {KEY}"}

PROTECTED = [
    ("GET", "/ready"),
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/redoc"),
    ("GET", "/openapi.json"),
    ("POST", "/v1/tts"),
    ("POST", "/v1/audio/speech"),
    ("POST", "/v1/tts/batch"),
    ("POST", "/v1/references/add"),
    ("GET", "/v1/references/list"),
    ("DELETE", "/v1/references/delete"),
    ("POST", "/v1/references/update"),
    ("POST", "/v1/vqgan/encode"),
    ("POST", "/v1/vqgan/decode"),
    ("GET", "/v1/models"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # One request decoding and one waiting at most, so a third is turned away.
    args = ("--api-key", KEY, "--max-batch-size", "1")
    with DemoServer(tmp_path_factory.mktemp("auth"), *args, env={"S1_MINI_MAX_QUEUE": "1"}) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health_needs_no_key(http, path):
    assert http.get(path).status_code == 200


@pytest.mark.parametrize(
    "headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": KEY}], ids=["none", "wrong", "no-scheme"]
)
@pytest.mark.parametrize("method, path", PROTECTED, ids=[p for _, p in PROTECTED])
def test_routes_refuse_a_missing_or_wrong_key(http, method, path, headers):
    r = http.request(method, path, headers=headers, json={"text": "hi"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in error_message(r)
    if path.startswith(("/v1/audio/", "/v1/models")):  # OpenAI's shape: its SDKs read a string code
        assert r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}], ids=["none", "wrong"])
def test_the_live_websocket_refuses_a_missing_or_wrong_key(server, headers):
    with pytest.raises(InvalidStatus) as refused:
        connect(server.url.replace("http", "ws", 1) + "/v1/tts/live", additional_headers=headers, open_timeout=30)
    assert refused.value.response.status_code == 403


def test_the_live_websocket_speaks_with_the_key(server):
    with connect(server.url.replace("http", "ws", 1) + "/v1/tts/live", additional_headers=GOOD, open_timeout=30) as ws:
        ws.send(ormsgpack.packb({"event": "start", "request": {"text": "", "format": "wav", **FAST}}))
        ws.send(ormsgpack.packb({"event": "text", "text": "Authorized live speech."}))
        ws.send(ormsgpack.packb({"event": "stop"}))
        messages = [ormsgpack.unpackb(m) for m in ws]
    assert messages[-1] == {"event": "finish", "reason": "stop"}
    assert_audio(b"".join(m["audio"] for m in messages if m["event"] == "audio"))


def test_right_key_opens_the_api(http):
    assert http.get("/ready", headers=GOOD).status_code == 200
    assert http.get("/v1/references/list?format=json", headers=GOOD).json()["success"] is True
    assert "s1mini_requests_total" in http.get("/metrics", headers=GOOD).text
    r = http.post("/v1/tts", headers=GOOD, json={"text": "Authorized speech.", **FAST})
    assert r.status_code == 200
    assert_audio(r.content)


def test_ui_needs_a_login_with_the_key(server):
    with pytest.raises(AuthenticationError, match="Please login"):
        Client(server.url, verbose=False, download_files=False)
    with pytest.raises(ValueError, match="Could not login"):
        Client(server.url, auth=("anyone", "wrong"), verbose=False, download_files=False)
    client = Client(server.url, auth=("anyone", KEY), verbose=False, download_files=False)
    assert "/speak" in client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    client.close()


def test_ui_login_also_opens_the_docs(http):
    assert http.post("/login", data={"username": "me", "password": "wrong"}).status_code == 400
    with httpx.Client(base_url=str(http.base_url)) as browser:
        assert browser.get("/docs").status_code == 401
        assert browser.post("/login", data={"username": "me", "password": KEY}).status_code == 200
        assert browser.get("/docs").status_code == 200
        assert "/v1/tts" in browser.get("/openapi.json").json()["paths"]


def test_full_queue_answers_429_with_retry_after(http):
    responses = []

    def speak():
        body = {"text": "Keep the engine busy for a while.", "max_new_tokens": 120, "seed": 1}
        responses.append(http.post("/v1/tts", headers=GOOD, json=body))

    threads = [threading.Thread(target=speak) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    busy = [r for r in responses if r.status_code == 429]
    assert busy, [r.status_code for r in responses]
    assert int(busy[0].headers["retry-after"]) >= 1
    assert "busy" in busy[0].json()["message"]
    assert all(r.status_code in (200, 429) for r in responses)
    assert any(r.status_code == 200 for r in responses)
