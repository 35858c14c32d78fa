"""The API driven by other people's clients against `launch.py --demo`: the official `openai` SDK,
the Fish Audio SDK (`fishaudio`, and its legacy `fish_audio_sdk` session, whose stream reads the
response as it comes), fish-speech's request bodies, and a browser's CORS checks. Every audio
answer is decoded back and checked (sample rate, length, not silent)."""

from __future__ import annotations

import base64
import json
import threading

import httpx
import numpy as np
import openai
import ormsgpack
import pytest
from fish_audio_sdk import Session
from fish_audio_sdk import TTSRequest as LegacyTTSRequest
from fishaudio import FishAudio
from fishaudio.types import Prosody, TTSConfig
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import connect

from engine.ffmpeg import decoded
from tests.test_app_support import (
    FAST,
    ONE_FRAME_S,
    SAMPLE_RATE,
    SAMPLES_PER_FRAME,
    DemoServer,
    assert_audible,
    decode_pcm16,
    reference_clip_wav,
    requests_in_engine,
)

ORIGIN = "https://app.example"
# Several text chunks at chunk_length 100: a stream of several pieces, generated one after another.
LONG_TEXT = (
    "The first sentence is here to fill the opening chunk of this request with words. "
    "A second sentence follows it and lands in the next chunk of the same request. "
    "Finally a third sentence closes the text so that streaming has a tail to send."
)
OPENAI_FAST = {"extra_body": FAST}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ("--no-ui", "--cors-origins", ORIGIN, "--openai-voices", "nova=narrator")
    with DemoServer(tmp_path_factory.mktemp("clients"), *args) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)


@pytest.fixture(scope="module")
def narrator(http):
    """A saved voice, added with a JSON body (base64 audio), as fish-speech's clients may send it."""
    body = {"id": "narrator", "audio": base64.b64encode(reference_clip_wav()).decode(), "text": "a gliding tone"}
    r = http.post("/v1/references/add?format=json", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["reference_id"] == "narrator"
    return "narrator"


def decode_any(data: bytes) -> tuple[np.ndarray, int]:
    """Samples and rate of any container ffmpeg reads (AAC/ADTS included, which libsndfile lacks),
    through the engine's ffmpeg: the one on PATH, else imageio-ffmpeg's, which has no ffprobe."""
    with decoded(data) as audio:
        samples = np.concatenate(list(audio.blocks(1 << 16)))
        return samples.mean(axis=1), audio.samplerate


def check_audio(data: bytes, rate: int, min_seconds: float = ONE_FRAME_S) -> np.ndarray:
    samples, got = decode_any(data)
    assert got == rate, f"sample rate {got}, expected {rate}"
    assert_audible(samples, min_seconds, rate)
    return samples


@pytest.mark.parametrize("fmt, rate", [("opus", 48000), ("mp3", 44100), ("aac", 44100), ("flac", 44100),
                                       ("wav", 44100)])
@pytest.mark.parametrize("streaming", [True, False])
def test_one_frame_of_speech_comes_whole_in_every_format(http, fmt, rate, streaming):
    """The shortest answer the demo model can give (it may end after any frame): a single frame
    decodes to that frame's time, resampled where the format's rate differs."""
    r = http.post("/v1/tts", json={"text": "One frame.", "format": fmt, "max_new_tokens": 1, "seed": 1,
                                   "streaming": streaming})
    assert r.status_code == 200, r.text
    check_audio(r.content, rate)


# ---- OpenAI SDK --------------------------------------------------------------------------------


# OpenAI's rates: pcm is 24 kHz; the others keep the model's 44.1 kHz (Opus decodes at 48 kHz).
@pytest.mark.parametrize("fmt, rate", [("mp3", 44100), ("opus", 48000), ("aac", 44100), ("flac", 44100),
                                       ("wav", 44100)])
def test_openai_every_format_decodes(oa, fmt, rate):
    audio = oa.audio.speech.create(model="tts-1", voice="alloy", input="Every format.", response_format=fmt,
                                   **OPENAI_FAST)
    check_audio(audio.content, rate)


def test_openai_pcm_is_24_khz_16_bit_mono(oa, http):
    pcm = oa.audio.speech.create(model="tts-1", voice="alloy", input="Raw audio.", response_format="pcm",
                                 **OPENAI_FAST).content
    wav = oa.audio.speech.create(model="tts-1", voice="alloy", input="Raw audio.", response_format="wav",
                                 **OPENAI_FAST).content
    samples = decode_pcm16(pcm)
    assert_audible(samples, ONE_FRAME_S, 24000)
    reference, rate = decode_any(wav)
    assert rate == SAMPLE_RATE
    # The same audio, resampled from 44.1 to 24 kHz: the same duration to a few samples.
    assert abs(len(samples) / 24000 - len(reference) / SAMPLE_RATE) < 0.002


@pytest.mark.parametrize("fmt", ["wav", "pcm", "mp3", "opus", "aac", "flac"])
def test_openai_streaming_response_sends_audio_before_the_engine_finishes(oa, http, fmt):
    request = dict(model="tts-1", voice="alloy", input=LONG_TEXT, response_format=fmt,
                   extra_body={**FAST, "max_new_tokens": 48, "chunk_length": 100})
    pieces, in_progress_at_first = [], None
    with oa.audio.speech.with_streaming_response.create(**request) as response:
        for piece in response.iter_bytes():
            if in_progress_at_first is None:
                # Still generating: the first bytes came early.
                in_progress_at_first = requests_in_engine(http.get("/metrics").text)
            pieces.append(piece)
    assert in_progress_at_first >= 1, "the first bytes arrived only after the engine had finished"
    data = b"".join(pieces)
    if fmt == "pcm":
        assert_audible(decode_pcm16(data), 2 * ONE_FRAME_S, 24000)
    else:
        check_audio(data, 48000 if fmt == "opus" else SAMPLE_RATE, 2 * ONE_FRAME_S)


def _sse_events(response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(json.loads(line[len("data: "):]))
    return events


def test_openai_sse_sends_delta_events_then_done_with_usage(oa, http):
    request = dict(model="gpt-4o-mini-tts", voice="alloy", input=LONG_TEXT, response_format="pcm",
                   stream_format="sse", extra_body={**FAST, "max_new_tokens": 48, "chunk_length": 100})
    with oa.audio.speech.with_streaming_response.create(**request) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(response)
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    assert done["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    samples = decode_pcm16(pcm)
    assert_audible(samples, 2 * ONE_FRAME_S, 24000)
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    # Output tokens are the codec frames: 2048 samples each at 44.1 kHz.
    assert usage["output_tokens"] == pytest.approx(len(samples) / 24000 * SAMPLE_RATE / SAMPLES_PER_FRAME, abs=1)


@pytest.mark.parametrize("speed", [0.5, 2.0, 4.0])
def test_openai_speed_stretches_time(oa, speed):
    def seconds(speed_value: float) -> float:
        audio = oa.audio.speech.create(model="tts-1", voice="alloy", input="Same words, other speed.",
                                       response_format="wav", speed=speed_value, **OPENAI_FAST)
        return len(check_audio(audio.content, SAMPLE_RATE, 0.1)) / SAMPLE_RATE

    # Same seed, same audio; atempo keeps the duration ratio to within its window at the ends.
    assert seconds(speed) == pytest.approx(seconds(1.0) / speed, abs=0.05)


def test_openai_voices_by_name_id_and_mapping(oa, http, narrator):
    def pcm(voice, **extra) -> bytes:
        return oa.audio.speech.create(model="tts-1", voice=voice, input="Whose voice is this?",
                                      response_format="pcm", extra_body={**FAST, **extra}).content

    saved, by_id, mapped, default = pcm("narrator"), pcm({"id": "narrator"}), pcm("nova"), pcm("alloy")
    assert_audible(decode_pcm16(saved), ONE_FRAME_S, 24000)
    assert by_id == saved and mapped == saved  # "nova" is mapped to the saved voice by --openai-voices
    assert default != saved  # "alloy" is unmapped: the model's own voice
    assert pcm("Narrator", reference_id="narrator") == saved  # one voice, named in two cases
    with pytest.raises(openai.BadRequestError, match="name different voices"):
        pcm("narrator", reference_id="someone-else")

    voices = http.get("/v1/audio/voices").json()["voices"]
    assert voices[0] == "narrator" and {"alloy", "nova", "shimmer"} <= set(voices)


def test_openai_inline_references_clone_and_conflicts_are_refused(oa, narrator):
    ref = {"audio": base64.b64encode(reference_clip_wav()).decode(), "text": "a gliding tone"}
    audio = oa.audio.speech.create(model="tts-1", voice="alloy", input="Cloned inline.", response_format="wav",
                                   extra_body={**FAST, "references": [ref]})
    check_audio(audio.content, SAMPLE_RATE)
    with pytest.raises(openai.BadRequestError, match="saved voice"):
        oa.audio.speech.create(model="tts-1", voice="nova", input="Conflict.", extra_body={"references": [ref]})


def test_openai_models_and_refusals(oa):
    ids = [m.id for m in oa.models.list()]
    assert ids[0] == "s1-mini" and "tts-1" in ids
    assert oa.models.retrieve("tts-1").id == "tts-1"
    with pytest.raises(openai.NotFoundError):
        oa.models.retrieve("dall-e-3")
    with pytest.raises(openai.BadRequestError, match="not served"):
        oa.audio.speech.create(model="whisper-1", voice="alloy", input="Wrong model.")
    with pytest.raises(openai.BadRequestError, match="instructions are not supported"):
        oa.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", instructions="Speak cheerfully.")
    with pytest.raises(openai.UnprocessableEntityError):
        oa.audio.speech.create(model="tts-1", voice="alloy", input="Too fast.", speed=5.0)


# ---- Fish Audio SDK ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fish(server):
    with FishAudio(api_key="unused", base_url=server.url) as client:
        yield client


FISH_FAST = dict(max_new_tokens=16, chunk_length=200)


def test_fish_convert_honours_sample_rate_and_prosody(fish):
    plain = fish.tts.convert(text="Fish audio request.", format="wav", config=TTSConfig(**FISH_FAST))
    base = check_audio(plain, SAMPLE_RATE)
    config = TTSConfig(sample_rate=16000, prosody=Prosody(speed=2.0, volume=-12.0), latency="normal", **FISH_FAST)
    shaped = fish.tts.convert(text="Fish audio request.", format="wav", config=config)
    samples = check_audio(shaped, 16000, ONE_FRAME_S / 2)
    # Random sampling: the demo model's lengths vary by request (one frame, at speed 2, is half a
    # frame's time); speed 2 and 16 kHz still show in the rate (decoded above) and in a quieter
    # signal (-12 dB is a quarter of the amplitude).
    assert np.sqrt(np.mean(samples**2)) < np.sqrt(np.mean(base**2))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "pcm"])
def test_fish_stream_collects_decodable_audio(fish, fmt):
    data = fish.tts.stream(text="Streamed by the SDK.", format=fmt, config=TTSConfig(**FISH_FAST)).collect()
    if fmt == "pcm":
        assert_audible(decode_pcm16(data), ONE_FRAME_S, SAMPLE_RATE)
    else:
        check_audio(data, 48000 if fmt == "opus" else SAMPLE_RATE)


def test_fish_legacy_session_stream_receives_audio_before_the_end(server, http):
    """fishaudio's tts.stream reads the whole response before its first chunk (httpx request without
    stream=True, SDK 1.3); the same package's legacy Session streams, so it shows the server's side."""
    session = Session("unused", base_url=server.url)
    request = LegacyTTSRequest(text=LONG_TEXT, format="wav", chunk_length=100, latency="normal")
    body = {**request.model_dump(), "max_new_tokens": 48}  # the legacy model has no max_new_tokens field
    pieces, in_progress_at_first = [], None
    with httpx.Client(base_url=server.url, timeout=120) as client:
        headers = {"content-type": "application/msgpack", "model": "s1"}
        with client.stream("POST", "/v1/tts", content=ormsgpack.packb(body), headers=headers) as r:
            assert r.status_code == 200
            for piece in r.iter_bytes():
                if in_progress_at_first is None:
                    in_progress_at_first = requests_in_engine(http.get("/metrics").text)
                pieces.append(piece)
    assert in_progress_at_first >= 1
    check_audio(b"".join(pieces), SAMPLE_RATE, 2 * ONE_FRAME_S)
    streamed = b"".join(session.tts(LegacyTTSRequest(text="Legacy session.", format="mp3"), backend="s1"))
    check_audio(streamed, SAMPLE_RATE)


def test_fish_legacy_session_reports_the_servers_message(server):
    from fish_audio_sdk import HttpCodeErr

    with pytest.raises(HttpCodeErr) as refused:
        Session("unused", base_url=server.url).get_api_credit()
    assert refused.value.status == 501 and "not offered" in refused.value.message


def test_fish_live_websocket_sends_audio_before_the_last_text(fish):
    first_audio = threading.Event()
    audio_before_last_text = []

    def text_pieces():
        yield "Hello from a live agent, "
        yield "this is the first sentence. "
        audio_before_last_text.append(first_audio.wait(timeout=120))
        yield "And here is the last one."

    chunks = []
    for chunk in fish.tts.stream_websocket(text_pieces(), format="wav", config=TTSConfig(**FISH_FAST)):
        chunks.append(chunk)
        first_audio.set()
    assert audio_before_last_text == [True], "no audio came before the last text piece was sent"
    check_audio(b"".join(chunks), SAMPLE_RATE, 2 * ONE_FRAME_S)


def test_fish_live_websocket_resamples_and_reports_errors(fish):
    from fishaudio.exceptions import WebSocketError

    config = TTSConfig(sample_rate=24000, **FISH_FAST)
    data = b"".join(fish.tts.stream_websocket(iter(["One sentence, mp3, 24 kHz."]), format="mp3", config=config))
    check_audio(data, 24000)
    with pytest.raises(WebSocketError):
        list(fish.tts.stream_websocket(iter(["Nobody saved this voice."]), reference_id="nobody", format="wav",
                                       config=TTSConfig(**FISH_FAST)))


def test_fish_live_websocket_speaks_a_text_event_over_the_length_limit_in_pieces(fish):
    text = "A sentence the agent wrote at once. " * 60  # 2,160 characters: over the server's 2,000
    data = b"".join(fish.tts.stream_websocket(iter([text]), format="wav", config=TTSConfig(**FISH_FAST)))
    check_audio(data, SAMPLE_RATE, 2 * ONE_FRAME_S)


@pytest.mark.parametrize("after_start", [False, True], ids=["first", "after-start"])
def test_a_text_frame_on_the_live_websocket_is_the_clients_error(server, after_start):
    with connect(server.url.replace("http", "ws", 1) + "/v1/tts/live", open_timeout=30) as ws:
        if after_start:
            ws.send(ormsgpack.packb({"event": "start", "request": {"text": "", **FISH_FAST}}))
        ws.send(json.dumps({"event": "text", "text": "Hello."}))
        messages = []
        with pytest.raises(ConnectionClosedError) as closed:
            while True:
                messages.append(ormsgpack.unpackb(ws.recv(timeout=60)))
    assert messages[-1]["event"] == "finish" and messages[-1]["reason"] == "error"
    assert "binary frames, got a text frame" in messages[-1]["message"]
    assert closed.value.rcvd.code == 1008  # the client's error, not the server's (1011)


def test_fish_sdk_calls_with_no_route_here_fail_clearly(fish):
    from fishaudio.exceptions import ServerError

    with pytest.raises(ServerError, match=r"voices\.\* calls\) are not offered") as refused:
        fish.voices.list()
    assert refused.value.status == 501
    with pytest.raises(ServerError, match=r"account\.\* calls"):
        fish.account.get_credits()


# ---- fish-speech bodies, answers and codec routes ----------------------------------------------


def test_references_add_msgpack_and_fish_speech_negotiation(http):
    body = {"id": "packed", "audio": reference_clip_wav(), "text": "a gliding tone"}
    r = http.post("/v1/references/add", content=ormsgpack.packb(body), headers={"content-type": "application/msgpack"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    assert ormsgpack.unpackb(r.content)["reference_id"] == "packed"
    # fish-speech answers msgpack unless JSON is asked for (Accept or ?format=json).
    listed = http.get("/v1/references/list")
    assert listed.headers["content-type"] == "application/msgpack"
    assert "packed" in ormsgpack.unpackb(listed.content)["reference_ids"]
    assert "packed" in http.get("/v1/references/list", headers={"accept": "application/json"}).json()["reference_ids"]
    assert "packed" in http.get("/v1/references/list?format=json").json()["reference_ids"]
    files = {"audio": ("clip.wav", reference_clip_wav(), "audio/wav")}
    r = http.post("/v1/references/add?format=json", data={"id": "parted", "text": "a tone"}, files=files)
    assert r.status_code == 200 and r.json()["reference_id"] == "parted"


def test_vqgan_encode_then_decode(http):
    clip = reference_clip_wav(seconds=2.0)
    r = http.post("/v1/vqgan/encode", content=ormsgpack.packb({"audios": [clip]}),
                  headers={"content-type": "application/msgpack"})
    assert r.status_code == 200, r.text
    tokens = ormsgpack.unpackb(r.content)["tokens"]
    frames = -(-2 * SAMPLE_RATE // SAMPLES_PER_FRAME)
    assert len(tokens) == 1 and len(tokens[0]) == 10 and {len(row) for row in tokens[0]} == {frames}
    r = http.post("/v1/vqgan/decode", content=ormsgpack.packb({"tokens": tokens}),
                  headers={"content-type": "application/msgpack"})
    assert r.status_code == 200, r.text
    audio = np.frombuffer(ormsgpack.unpackb(r.content)["audios"][0], dtype="<f2").astype(np.float32)
    assert len(audio) == frames * SAMPLES_PER_FRAME
    assert_audible(audio, 1.0, SAMPLE_RATE)
    bad = http.post("/v1/vqgan/decode?format=json", json={"tokens": [[[5000] * 3] * 10]})
    assert bad.status_code == 400 and "codebook 0" in bad.json()["message"]
    for huge in (2**63, -(2**63) - 1):  # beyond int64: refused as the codes they are, not a server error
        bad = http.post("/v1/vqgan/decode?format=json", json={"tokens": [[[huge]] * 10]})
        assert bad.status_code == 400 and "out of range" in bad.json()["message"]



def test_a_vqgan_decode_body_is_bounded_by_what_a_valid_one_needs(http):
    from app.routes_vqgan import MAX_DECODE_BODY, MAX_ITEMS

    largest = json.dumps({"tokens": [[[4095] * 4096] * 10] * MAX_ITEMS})  # the most a server decodes
    assert len(largest) < MAX_DECODE_BODY
    big = {"tokens": [[[1] * (MAX_DECODE_BODY // 5)] * 10]}  # 16 MB of msgpack, 32 MB of JSON
    for kind, body in (("application/json", json.dumps(big).encode()), ("application/msgpack", ormsgpack.packb(big))):
        r = http.post("/v1/vqgan/decode", content=body, headers={"content-type": kind})
        assert r.status_code == 413 and "at most 8 MB" in r.json()["message"], r.text[:300]


# ---- browsers ----------------------------------------------------------------------------------


def test_cors_preflight_and_headers_for_allowed_origins_only(http):
    preflight = http.options("/v1/audio/speech", headers={
        "origin": ORIGIN, "access-control-request-method": "POST",
        "access-control-request-headers": "content-type,authorization"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    r = http.get("/v1/models", headers={"origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    other = http.get("/v1/models", headers={"origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers
    # a page on an allowed origin may send bodies; one elsewhere may not
    body = {"text": "Hi.", "format": "wav", **FAST}
    allowed = http.post("/v1/tts", json=body, headers={"origin": ORIGIN, "sec-fetch-site": "cross-site"})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    refused = http.post("/v1/tts", json=body, headers={"origin": "https://elsewhere.example",
                                                        "sec-fetch-site": "cross-site"})
    assert refused.status_code == 403


def test_openapi_documents_the_new_routes(http):
    paths = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/models", "/v1/models/{model_id}", "/v1/audio/voices", "/v1/vqgan/encode", "/v1/vqgan/decode"):
        assert path in paths, path
    speech = paths["/v1/audio/speech"]["post"]["responses"]["200"]["content"]
    assert {"audio/aac", "audio/pcm", "text/event-stream"} <= set(speech)
    add = paths["/v1/references/add"]["post"]["requestBody"]["content"]
    assert set(add) == {"application/json", "application/msgpack", "multipart/form-data"}
