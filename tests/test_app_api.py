"""The REST API over real HTTP against `launch.py --demo`: every route, every audio format decoded
back, streaming, saved voices, batch, metrics, and a clear 4xx for each kind of bad input."""

from __future__ import annotations

import base64
import json
import sys
import threading

import httpx
import numpy as np
import ormsgpack
import pytest

from tests.test_app_support import (
    FAST,
    ONE_FRAME_S,
    SAMPLE_RATE,
    SAMPLES_PER_FRAME,
    ROOT,
    DemoServer,
    assert_audible,
    assert_audio,
    decode_pcm16,
    error_message,
    metric_value,
    reference_clip_wav,
)

sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402

EMPTY_WAV = reference_clip_wav(seconds=0.0)  # a header and no samples

# Long enough for several text chunks at chunk_length 100, so a stream is written in several pieces.
LONG_TEXT = (
    "The first sentence is here to fill the opening chunk of this request with words. "
    "A second sentence follows it and lands in the next chunk of the same request. "
    "Finally a third sentence closes the text so that streaming has a tail to send."
)
MAX_SECONDS = FAST["max_new_tokens"] * SAMPLES_PER_FRAME / SAMPLE_RATE


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with DemoServer(tmp_path_factory.mktemp("api")) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    # JSON answers from the voice routes, which answer msgpack by default as fish-speech's do.
    with httpx.Client(base_url=server.url, timeout=120, headers={"accept": "application/json"}) as client:
        yield client


def tts(http, **fields) -> httpx.Response:
    return http.post("/v1/tts", json={"text": "Hello there, world.", **FAST, **fields})


# ---- system ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health(http, path):
    r = http.get(path)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/health", "/v1/health", "/ready", "/metrics"])
def test_probes_may_send_head(http, path):  # curl -I, some load balancers
    r = http.head(path)
    assert r.status_code == 200 and r.content == b""


def test_ready_after_warmup(http):
    r = http.get("/ready")
    # Eager on a CPU: no graphs to capture, every slot can run at once from the start.
    assert r.status_code == 200 and r.json() == {"status": "ready", "slots_ready": 4, "slots": 4, "capturing": False}


def test_openapi_lists_every_route_and_docs_render(http):
    paths = http.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/tts",
        "/v1/audio/speech",
        "/v1/tts/batch",
        "/v1/references/add",
        "/v1/references/list",
        "/v1/references/delete",
        "/v1/references/update",
        "/health",
        "/ready",
        "/metrics",
    ):
        assert path in paths, path
    schema = paths["/v1/tts"]["post"]["requestBody"]["content"]
    assert set(schema) == {"application/json", "application/msgpack", "multipart/form-data"}
    # Client generators name a method after its operation's id: one id per operation.
    ids = [operation["operationId"] for methods in paths.values() for operation in methods.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    docs = http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_ui_page_is_served_beside_the_api(http):
    r = http.get("/")
    assert r.status_code == 200 and "<html" in r.text.lower()


# ---- /v1/tts formats ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_wav(http) -> np.ndarray:
    r = tts(http, format="wav")
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
    samples = assert_audio(r.content)
    assert len(samples) <= MAX_SECONDS * SAMPLE_RATE
    return samples


@pytest.mark.parametrize(
    "fmt, content_type, rate",
    [("flac", "audio/flac", 44100), ("mp3", "audio/mpeg", 44100), ("opus", "audio/ogg", 48000)],
)
def test_tts_encoded_formats_decode_to_the_same_audio_length(http, reference_wav, fmt, content_type, rate):
    r = tts(http, format=fmt)
    assert r.status_code == 200
    assert r.headers["content-type"] == content_type
    assert r.headers["content-disposition"] == f"attachment; filename=audio.{fmt}"
    samples = assert_audio(r.content, rate)
    # Same seed, same audio: only encoder padding may differ.
    assert abs(len(samples) / rate - len(reference_wav) / SAMPLE_RATE) < 0.08


def test_tts_pcm_is_raw_16_bit_at_the_announced_rate(http, reference_wav):
    r = tts(http, format="pcm")
    assert r.status_code == 200 and r.headers["x-sample-rate"] == str(SAMPLE_RATE)
    samples = decode_pcm16(r.content)
    assert len(samples) == len(reference_wav)
    np.testing.assert_allclose(samples, reference_wav, atol=2 / 32768)


def test_tts_msgpack_body_with_inline_reference(http):
    body = {
        "text": "Cloned voice, msgpack body.",
        "references": [{"audio": reference_clip_wav(), "text": "a tone"}],
        **FAST,
    }
    r = http.post("/v1/tts", content=ormsgpack.packb(body), headers={"content-type": "application/msgpack"})
    assert r.status_code == 200, r.text
    assert_audio(r.content)


def test_tts_json_body_with_base64_reference(http):
    ref = base64.b64encode(reference_clip_wav()).decode()
    r = tts(http, references=[{"audio": ref, "text": "a tone"}])
    assert r.status_code == 200, r.text
    assert_audio(r.content)


def test_tts_multipart_body_with_reference_parts(http):
    fields = {"text": "Multipart body.", "format": "flac", **{k: str(v) for k, v in FAST.items()}}
    fields["reference_text"] = "a tone"
    r = http.post("/v1/tts", data=fields, files={"reference_audio": ("ref.wav", reference_clip_wav(), "audio/wav")})
    assert r.status_code == 200, r.text
    assert_audio(r.content)


# ---- streaming ----------------------------------------------------------------------------------


def _stream(http, url, body) -> tuple[bytes, httpx.Headers]:
    with http.stream("POST", url, json=body) as r:
        assert r.status_code == 200, r.read()
        return b"".join(r.iter_bytes()), r.headers


def _raw_http_chunks(http, path: str, body: dict) -> list[bytes]:
    """The bodies of the HTTP/1.1 chunks of a streamed response, as the server framed them (a
    client's reads may merge them; the chunk framing keeps each write apart)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(str(http.base_url))
    payload = json.dumps(body).encode()
    with socket.create_connection((url.hostname, url.port), timeout=120) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.hostname}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        raw = b""
        while piece := sock.recv(65536):
            raw += piece
    rest = raw.split(b"\r\n\r\n", 1)[1]
    chunks = []
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return chunks
        chunks.append(rest[:size])
        rest = rest[size + 2:]


def test_streaming_wav_sends_audio_before_the_end(http):
    body = {"text": LONG_TEXT, "streaming": True, "chunk_length": 100, **FAST}
    data, headers = _stream(http, "/v1/tts", body)
    assert headers["content-type"] == "audio/wav" and data[:4] == b"RIFF"
    assert len(data) > 44 + 2 * SAMPLES_PER_FRAME
    # Sent as it is generated: HTTP chunks written one after another, several of them with audio
    # (a body sent whole would be one write, or a Content-Length).
    assert headers.get("transfer-encoding") == "chunked" and "content-length" not in headers
    chunks = _raw_http_chunks(http, "/v1/tts", body)
    assert sum(len(c) for c in chunks) == len(data) and sum(len(c) for c in chunks[1:]) > 0
    assert len([c for c in chunks if c]) > 2, "all audio came in one write"
    samples = assert_audio(data)
    assert len(samples) == (len(data) - 44) // 2


def test_streaming_pcm(http):
    data, headers = _stream(
        http, "/v1/tts", {"text": "Stream raw PCM please.", "streaming": True, "format": "pcm", **FAST}
    )
    assert headers["x-sample-rate"] == str(SAMPLE_RATE)
    assert_audible(decode_pcm16(data), ONE_FRAME_S, SAMPLE_RATE)


def server_timing(headers) -> dict[str, float]:
    """{stage: ms} of the answer's Server-Timing header, read as the load test reads it."""
    return load_test.server_timing(headers["server-timing"])


@pytest.mark.parametrize("streaming", [True, False])
def test_speech_says_where_its_time_to_first_audio_went(http, streaming):
    """The engine's stages until the first audio, in a Server-Timing header: with the first audio
    when streaming, with the whole file otherwise; a new reference clip shows its encode."""
    ref = base64.b64encode(reference_clip_wav(seconds=1.5 if streaming else 1.6, rate=44100)).decode()  # new
    body = {"text": "Where did the time go?", "streaming": streaming, "format": "pcm", **FAST,
            "references": [{"audio": ref, "text": "a tone of its own"}]}
    data, headers = _stream(http, "/v1/tts", body)
    stages = server_timing(headers)
    assert list(stages) == ["prepared", "started", "voice_ready", "first_frames", "first_audio"]
    assert all(ms >= 0 for ms in stages.values()) and stages["voice_ready"] > 0 and len(data) > 0
    no_voice = _stream(http, "/v1/audio/speech", {"input": "No clip here.", "response_format": "pcm",
                                                   "stream": streaming, **FAST})[1]
    assert list(server_timing(no_voice)) == list(stages)
    events = _stream(http, "/v1/audio/speech", {"input": "As events.", "stream_format": "sse", **FAST})[1]
    assert events["content-type"].startswith("text/event-stream") and list(server_timing(events)) == list(stages)


def test_client_leaving_a_stream_does_not_hurt_the_server(http):
    body = {"text": LONG_TEXT * 2, "streaming": True, "chunk_length": 100, **FAST}
    with http.stream("POST", "/v1/tts", json=body) as r:
        assert r.status_code == 200
        next(r.iter_bytes())
    assert tts(http).status_code == 200


# ---- OpenAI-compatible --------------------------------------------------------------------------


def test_openai_speech_default_mp3(http):
    r = http.post(
        "/v1/audio/speech", json={"model": "tts-1", "input": "Hello from the OpenAI route.", "voice": "alloy", **FAST}
    )
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    assert_audio(r.content)


def test_openai_speech_streams_wav(http):
    body = {"input": LONG_TEXT, "voice": "nova", "response_format": "wav", "stream": True, "chunk_length": 100, **FAST}
    data, _ = _stream(http, "/v1/audio/speech", body)
    assert_audio(data)


def test_openai_speech_voice_null_or_empty_is_the_default_voice(http):
    def pcm(**voice) -> bytes:
        r = http.post("/v1/audio/speech", json={"input": "Which voice?", "response_format": "pcm", **voice, **FAST})
        assert r.status_code == 200, r.text
        return r.content

    left_out = pcm()
    assert len(left_out) > 0 and pcm(voice=None) == left_out and pcm(voice="") == left_out == pcm(voice="default")


def test_openai_errors_use_openai_shape(http):
    r = http.post("/v1/audio/speech", json={"input": "hi", "voice": "nobody-saved-this"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "not_found" and error["param"] is None
    assert "nobody-saved-this" in error_message(r)


# ---- batch --------------------------------------------------------------------------------------


def test_batch_gives_per_item_results_and_errors(http):
    r = http.post("/v1/tts/batch", json={"texts": ["First item.", "  ", "Third item."], "format": "flac", **FAST})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["sample_rate"] == SAMPLE_RATE and body["format"] == "flac"
    first, bad, third = body["results"]
    assert bad["ok"] is False and bad["error"]["status"] == 400 and "empty" in bad["error"]["message"]
    for item in (first, third):
        assert item["ok"] is True
        samples = assert_audio(base64.b64decode(item["audio"]))
        assert abs(item["duration_s"] - len(samples) / SAMPLE_RATE) < 0.01
        assert isinstance(item["stats"]["seed"], int) and isinstance(item["stats"]["frames"], int)  # not 7.0


def test_batch_answers_msgpack_with_raw_bytes(http):
    r = http.post("/v1/tts/batch", json={"texts": ["Only item."], **FAST}, headers={"accept": "application/msgpack"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    item = ormsgpack.unpackb(r.content)["results"][0]
    assert_audio(item["audio"])


# ---- saved voices -------------------------------------------------------------------------------


def add_voice(http, voice_id, text="a gliding tone"):
    return http.post(
        "/v1/references/add",
        data={"id": voice_id, "text": text},
        files={"audio": ("clip.wav", reference_clip_wav(), "audio/wav")},
    )


def list_voices(http) -> list[str]:
    r = http.get("/v1/references/list")
    assert r.status_code == 200
    return r.json()["reference_ids"]


def test_voice_lifecycle(http):
    r = add_voice(http, "api voice")
    assert r.status_code == 200 and r.json() == {
        "success": True,
        "message": "voice 'api voice' saved",
        "reference_id": "api voice",
    }
    assert "api voice" in list_voices(http)
    assert add_voice(http, "api voice").status_code == 409

    assert_audio(tts(http, reference_id="api voice").content)
    speech = http.post(
        "/v1/audio/speech", json={"input": "Saved voice.", "voice": "api voice", "response_format": "wav", **FAST}
    )
    assert speech.status_code == 200

    r = http.post("/v1/references/update", json={"old_reference_id": "api voice", "new_reference_id": "renamed"})
    assert r.status_code == 200 and r.json()["new_reference_id"] == "renamed"
    assert "renamed" in list_voices(http) and "api voice" not in list_voices(http)

    r = http.request("DELETE", "/v1/references/delete", json={"reference_id": "renamed"})
    assert r.status_code == 200 and r.json()["reference_id"] == "renamed"
    assert "renamed" not in list_voices(http)


def test_voice_delete_by_query_and_msgpack_listing(http):
    assert add_voice(http, "short-lived").status_code == 200
    listing = http.get("/v1/references/list", headers={"accept": "application/msgpack"})
    assert "short-lived" in ormsgpack.unpackb(listing.content)["reference_ids"]
    assert http.delete("/v1/references/delete", params={"reference_id": "short-lived"}).status_code == 200
    assert http.delete("/v1/references/delete", params={"reference_id": "short-lived"}).status_code == 404


# ---- bad input: always a 4xx with a message that says what to fix ---------------------------------

BAD_REQUESTS = [
    # (what, method, path, request kwargs, status, words in the message)
    ("empty text", "POST", "/v1/tts", {"json": {"text": "   "}}, 400, "empty"),
    ("missing text", "POST", "/v1/tts", {"json": {"format": "wav"}}, 422, "text"),
    ("text over the limit", "POST", "/v1/tts", {"json": {"text": "a" * 2001}}, 400, "limit"),
    ("temperature out of range", "POST", "/v1/tts", {"json": {"text": "hi", "temperature": 5}}, 422, "temperature"),
    ("top_p not a number", "POST", "/v1/tts", {"json": {"text": "hi", "top_p": "high"}}, 422, "top_p"),
    (
        "temperature NaN",
        "POST",
        "/v1/tts",
        {"content": b'{"text": "hi", "temperature": NaN}', "headers": {"content-type": "application/json"}},
        422,
        "temperature: Input should be a finite number",
    ),
    (
        "a seed of 5000 digits",
        "POST",
        "/v1/tts",
        {"content": b'{"text": "hi", "seed": ' + b"9" * 5000 + b"}", "headers": {"content-type": "application/json"}},
        400,
        "a number in it has more than 4300 digits",
    ),
    (
        "broken multipart",
        "POST",
        "/v1/tts",
        {"content": b"garbage", "headers": {"content-type": "multipart/form-data; boundary=x"}},
        400,
        "the form body could not be read: Invalid multipart data",  # the parser's words, no status in them
    ),
    ("unknown format", "POST", "/v1/tts", {"json": {"text": "hi", "format": "aiff"}}, 422, "format"),
    ("opus at 22 kHz", "POST", "/v1/tts", {"json": {"text": "hi", "format": "opus", "sample_rate": 22050}}, 400, "opus"),
    ("unknown voice", "POST", "/v1/tts", {"json": {"text": "hi", "reference_id": "ghost"}}, 404, "ghost"),
    (
        "broken JSON",
        "POST",
        "/v1/tts",
        {"content": b"{text:", "headers": {"content-type": "application/json"}},
        400,
        "JSON",
    ),
    ("JSON list body", "POST", "/v1/tts", {"json": ["hi"]}, 422, "object"),
    (
        "broken msgpack",
        "POST",
        "/v1/tts",
        {"content": b"\xc1", "headers": {"content-type": "application/msgpack"}},
        400,
        "msgpack",
    ),
    (
        "plain text body",
        "POST",
        "/v1/tts",
        {"content": b"hi", "headers": {"content-type": "text/plain"}},
        415,
        "application/x-www-form-urlencoded",  # the accepted types, the plain form among them
    ),
    ("no body", "POST", "/v1/tts", {}, 415, "Content-Type"),
    ("delete naming no voice", "DELETE", "/v1/references/delete", {}, 422, "?reference_id=ID"),
    (
        "reference not base64",
        "POST",
        "/v1/tts",
        {"json": {"text": "hi", "references": [{"audio": "%" * 300, "text": "t"}]}},
        422,
        "base64",
    ),
    (
        "reference not audio",
        "POST",
        "/v1/tts",
        {"json": {"text": "hi", "references": [{"audio": base64.b64encode(b"not audio" * 40).decode(), "text": "t"}]}},
        400,
        "audio",
    ),
    (  # the same answer as the multipart upload of that file below
        "reference an empty WAV in JSON",
        "POST",
        "/v1/tts",
        {"json": {"text": "hi", "references": [{"audio": base64.b64encode(EMPTY_WAV).decode(), "text": "t"}]}},
        400,
        "holds no audio samples",
    ),
    (
        "reference an empty WAV in multipart",
        "POST",
        "/v1/tts",
        {"data": {"text": "hi", "reference_text": "t"},
         "files": {"reference_audio": ("r.wav", EMPTY_WAV, "audio/wav")}},
        400,
        "holds no audio samples",
    ),
    (
        "reference a file path",
        "POST",
        "/v1/tts",
        {"json": {"text": "hi", "references": [{"audio": "voices/me.wav", "text": "t"}]}},
        422,
        "a file path or URL is not read",
    ),
    ("live route over plain HTTP", "GET", "/v1/tts/live", {}, 426, "is a WebSocket"),
    (
        "reference without transcript",
        "POST",
        "/v1/tts",
        {
            "json": {
                "text": "hi",
                "references": [{"audio": base64.b64encode(reference_clip_wav()).decode(), "text": " "}],
            }
        },
        400,
        "transcript",
    ),
    (
        "multipart audio without text",
        "POST",
        "/v1/tts",
        {"data": {"text": "hi"}, "files": {"reference_audio": ("r.wav", reference_clip_wav(), "audio/wav")}},
        422,
        "reference_text",
    ),
    ("openai empty input", "POST", "/v1/audio/speech", {"json": {"input": "", "voice": "alloy"}}, 400, "empty"),
    ("openai speed", "POST", "/v1/audio/speech", {"json": {"input": "hi", "speed": 5.0}}, 422, "speed"),
    (
        "openai format",
        "POST",
        "/v1/audio/speech",
        {"json": {"input": "hi", "response_format": "ogg"}},
        422,
        "response_format",
    ),
    ("batch without texts", "POST", "/v1/tts/batch", {"json": {"texts": []}}, 422, "texts"),
    ("batch too large", "POST", "/v1/tts/batch", {"json": {"texts": ["a"] * 101}}, 422, "at most 100"),
    (
        "voice id with slash",
        "POST",
        "/v1/references/add",
        {"data": {"id": "../etc", "text": "t"}, "files": {"audio": ("r.wav", reference_clip_wav(), "audio/wav")}},
        400,
        "voice id",
    ),
    ("voice without audio", "POST", "/v1/references/add", {"data": {"id": "x", "text": "t"}}, 422, "audio"),
    (
        "voice audio is not audio",
        "POST",
        "/v1/references/add",
        {"data": {"id": "broken", "text": "t"}, "files": {"audio": ("r.wav", b"RIFF" + b"\0" * 100, "audio/wav")}},
        400,
        "audio",
    ),
    (
        "rename a missing voice",
        "POST",
        "/v1/references/update",
        {"json": {"old_reference_id": "ghost", "new_reference_id": "spirit"}},
        404,
        "ghost",
    ),
    (
        "rename without new id",
        "POST",
        "/v1/references/update",
        {"json": {"old_reference_id": "ghost"}},
        422,
        "new_reference_id",
    ),
    ("delete without id", "DELETE", "/v1/references/delete", {"json": {}}, 422, "reference_id"),
]


@pytest.mark.parametrize("what, method, path, kwargs, status, words", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_gets_a_4xx_with_a_clear_message(http, what, method, path, kwargs, status, words):
    r = http.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    message = error_message(r)
    assert words.lower() in message.lower(), message
    assert "Traceback" not in r.text


def test_a_page_on_another_site_cannot_change_the_voices(http):
    add_voice(http, "keepsake")
    rename = {"old_reference_id": "keepsake", "new_reference_id": "taken"}
    evil = {"origin": "https://evil.example", "sec-fetch-site": "cross-site"}
    for request in ({"data": rename}, {"json": rename}):  # a form needs no preflight from a browser
        r = http.post("/v1/references/update", headers=evil, **request)
        assert r.status_code == 403 and "--cors-origins" in error_message(r), r.text
    r = http.request("DELETE", "/v1/references/delete", params={"reference_id": "keepsake"}, headers=evil)
    assert r.status_code == 403 and "keepsake" in list_voices(http)
    assert http.get("/v1/references/list", headers=evil).status_code == 200  # reading is not refused
    # the server's own pages, and clients that are not browsers
    for headers in ({"origin": http.base_url.scheme + "://" + http.base_url.netloc.decode(),
                     "sec-fetch-site": "same-origin"}, {}):
        r = http.post("/v1/references/update", json={"old_reference_id": "nobody", "new_reference_id": "x"},
                      headers=headers)
        assert r.status_code == 404, r.text
    http.request("DELETE", "/v1/references/delete", params={"reference_id": "keepsake"})


def test_thousands_of_bad_values_get_a_short_answer(http):
    codes = [[["a"] * 200] * 10] * 16  # 32,000 values that are not codes
    r = http.post("/v1/vqgan/decode?format=json", json={"tokens": codes})
    assert r.status_code == 422
    message = error_message(r)
    assert message.count("tokens.") == 10 and "and 31990 more errors" in message and len(r.content) < 4000


@pytest.mark.parametrize("path", ["/v1/tts", "/invocations", "/gradio_api/queue/join", "/gradio_api/upload"])
def test_oversized_body_is_refused_with_413(http, path):
    # SageMaker's route takes /v1/tts's body; Gradio's parse theirs before the login check answers.
    r = http.post(path, content=b"{" + b" " * (64 * 2**20 + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "64 MB" in error_message(r)
    if path.startswith("/gradio_api"):
        return  # a chunked body stops being read there too, but Gradio answers the error as its own 400

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(65):
            yield b" " * 2**20

    r = http.post(path, content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "64 MB" in error_message(r)


# ---- metrics (after the requests above) -----------------------------------------------------------


def test_metrics_count_requests_errors_and_audio(http):
    before = metric_value(http.get("/metrics").text, "s1mini_audio_seconds_total")
    assert tts(http).status_code == 200
    assert tts(http, temperature=9).status_code == 422
    text = http.get("/metrics").text
    assert metric_value(text, "s1mini_audio_seconds_total") > before
    assert metric_value(text, "s1mini_requests_total", '{route="/v1/tts",status="200"}') >= 1
    assert metric_value(text, "s1mini_request_errors_total", '{kind="client",route="/v1/tts"}') >= 1
    assert metric_value(text, "s1mini_time_to_first_audio_seconds_count") >= 1
    assert metric_value(text, "s1mini_real_time_factor_count") >= 1
    assert metric_value(text, "s1mini_ready") == 1
    assert metric_value(text, "s1mini_frames_per_second") > 0
    for gauge in ("s1mini_requests_waiting", "s1mini_requests_running", "s1mini_memory_bytes",
                  "s1mini_voice_prefix_hits", "s1mini_reference_encode_batches", "s1mini_reference_clips_encoded"):
        metric_value(text, gauge)
    assert metric_value(text, "s1mini_sequence_slots") == 4  # auto on a CPU
    assert metric_value(text, "s1mini_sequence_slots_ready") == 4
    assert 'device="cpu"' in text


def test_concurrent_requests_all_succeed(http):
    statuses = []

    def one(i):
        statuses.append(tts(http, text=f"Concurrent request number {i}.").status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 4
    assert json.loads(http.get("/health").text) == {"status": "ok"}
