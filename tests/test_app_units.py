"""Pieces of the app that need no model: batch input parsing, the error mapping, and how the
server answers when the engine itself fails (an engine stand-in raises on purpose)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from app.batch_input import batch_texts, texts_from_csv
from app.errors import INTERNAL_MESSAGE, HTTPProblem, problem_for
from app.server import create_app
from app.settings import AppSettings
from engine.errors import CheckpointError, InputError, QueueFullError, VoiceExistsError, VoiceNotFoundError
from engine.voice_store import VoiceStore

# ---- request bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize("tail", ["", "=", "=="])
def test_inline_reference_base64_is_read_as_the_standard_library_reads_it(tail):
    import base64

    from app.api_schema import ReferenceAudio

    audio = bytes(range(256)) * 3
    encoded = base64.b64encode(audio).decode() + tail  # extra padding: accepted there, by pybase64 alone not
    assert ReferenceAudio(audio=encoded, text="t").audio == audio
    for broken in ("%" + encoded[1:], encoded[:100] + "\n" + encoded[100:]):  # refused there too
        with pytest.raises(ValueError, match="not valid base64"):
            ReferenceAudio(audio=broken, text="t")


# ---- batch input -------------------------------------------------------------------------------


def test_csv_uses_the_text_column_when_named():
    assert texts_from_csv('id,text\n1,"Hello, you."\n2,\n3,Bye.\n') == ["Hello, you.", "Bye."]


def test_csv_without_header_uses_the_first_column():
    assert texts_from_csv("First one.,x\nSecond one.,y\n") == ["First one.", "Second one."]


def test_batch_texts_from_lines_file_and_limits(tmp_path):
    assert batch_texts(" a \n\n b \n", None, 10) == ["a", "b"]
    txt = tmp_path / "t.txt"
    txt.write_text("\ufeffone\ntwo\n", encoding="utf-8")
    assert batch_texts(None, str(txt), 10) == ["one", "two"]
    assert batch_texts("typed too", str(txt), 10) == ["one", "two", "typed too"]  # the file's first
    with pytest.raises(InputError, match="nothing to speak"):
        batch_texts(" \n ", None, 10)
    with pytest.raises(InputError, match="at most 1 texts"):
        batch_texts("a\nb", None, 1)
    bad = tmp_path / "t.docx"
    bad.write_text("x")
    with pytest.raises(InputError, match=".txt"):
        batch_texts(None, str(bad), 10)
    latin = tmp_path / "l.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InputError, match="UTF-8"):
        batch_texts(None, str(latin), 10)


# ---- error mapping -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, status",
    [
        (InputError("bad"), 400),
        (VoiceNotFoundError("no voice"), 404),
        (VoiceExistsError("exists"), 409),
        (QueueFullError("busy", retry_after_s=2.5), 429),
        (CheckpointError("missing"), 503),
        (HTTPProblem(415, "type"), 415),
        (RuntimeError("secret internals"), 500),
    ],
)
def test_problem_for(exc, status):
    problem = problem_for(exc)
    assert problem.status == status
    if status == 429:
        assert problem.headers == {"Retry-After": "3"}
    if status == 500:
        assert problem.message == INTERNAL_MESSAGE


# ---- engine failures seen over HTTP ---------------------------------------------------------------


class FailingEngine:
    """Just enough of TTSEngine for the app; synthesis fails the way it is told to."""

    sample_rate = 44100
    is_ready = True
    slots = slots_ready = 1
    capturing = False

    def __init__(self, voices_dir, error: Exception):
        self.voices = VoiceStore(voices_dir)
        self.error = error

    def stats(self) -> dict:
        return {"model": "stand-in", "device": "cpu", "precision": "fp32", "compile": "off", "demo": False}

    def synthesize(self, *args, **kwargs):
        raise self.error

    def synthesize_stream(self, *args, **kwargs):
        raise self.error
        yield  # a generator, like the engine's: the error comes with the first chunk

    def synthesize_batch(self, texts, **kwargs):
        return [self.error for _ in texts]


def client_for(tmp_path, error):
    return TestClient(create_app(FailingEngine(tmp_path, error), AppSettings()), raise_server_exceptions=False)


def test_engine_bug_is_a_json_500_without_internals(tmp_path):
    client = client_for(tmp_path, RuntimeError("secret internals"))
    r = client.post("/v1/tts", json={"text": "hi"})
    assert r.status_code == 500
    assert r.json()["message"] == INTERNAL_MESSAGE and "secret" not in r.text
    assert client.get("/health").status_code == 200  # and the server carries on


def test_busy_engine_is_429_with_retry_after_for_streams_too(tmp_path):
    client = client_for(tmp_path, QueueFullError("the engine is busy", retry_after_s=2))
    for body in ({"text": "hi"}, {"text": "hi", "streaming": True}):
        r = client.post("/v1/tts", json=body)
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        assert "busy" in r.json()["message"]


def test_batch_reports_engine_errors_per_item(tmp_path):
    client = client_for(tmp_path, QueueFullError("the engine is busy"))
    items = client.post("/v1/tts/batch", json={"texts": ["a", "b"]}).json()["results"]
    assert [i["error"]["status"] for i in items] == [429, 429]


def test_the_files_of_one_codec_encode_are_encoded_together_and_answered_in_order(tmp_path):
    """/v1/vqgan/encode hands its files to the engine at once, so that their new clips share the
    encoder's batched passes instead of each waiting for the one before."""
    import base64
    import threading

    import numpy as np

    all_asked = threading.Barrier(3, timeout=10)

    class Encoding(FailingEngine):
        def encode_codes(self, audio):
            all_asked.wait()  # breaks, failing the request, unless the three calls overlap
            return np.full((10, 2), len(audio))

    client = TestClient(create_app(Encoding(tmp_path, ValueError()), AppSettings()), raise_server_exceptions=False)
    files = [base64.b64encode(b"x" * n).decode() for n in (1, 2, 3)]
    r = client.post("/v1/vqgan/encode?format=json", json={"audios": files})
    assert r.status_code == 200, r.text
    assert [codes[0][0] for codes in r.json()["tokens"]] == [1, 2, 3]


def test_system_tab_says_while_larger_batches_are_still_being_captured(tmp_path):
    from app.ui_handlers import Handlers

    class Warming(FailingEngine):
        def stats(self) -> dict:
            return {**super().stats(), "running": 1, "slots": 64, "slots_ready": 2, "capturing": self.capturing}

    def system_text(capturing: bool) -> str:
        engine = Warming(tmp_path, ValueError())
        engine.capturing = capturing
        return Handlers.system_markdown(SimpleNamespace(synth=SimpleNamespace(engine=engine)))

    assert "1 of 64 at once" in system_text(True)
    assert "2 so far, while the larger batches' graphs are captured" in system_text(True)
    assert "2 only: capturing a larger batch's graphs failed (see the log)" in system_text(False)


@pytest.mark.parametrize("fmt", ["pcm", "mp3"])  # in-process, and through ffmpeg's feeder thread
def test_encode_stream_closing_it_closes_the_engine_stream(fmt):
    import threading

    import numpy as np

    from engine.audio import to_pcm16_bytes
    from engine.audio_stream import OutputSpec, encode_stream

    closed = threading.Event()

    def engine_stream():
        try:
            while True:
                yield np.full(4410, 0.25, dtype=np.float32)
        finally:
            closed.set()

    chunks = encode_stream(engine_stream(), 44100, OutputSpec(fmt))
    first = next(chunks)
    if fmt == "pcm":
        assert first == to_pcm16_bytes(np.full(4410, 0.25, dtype=np.float32))
    chunks.close()  # the listener went away
    assert closed.wait(timeout=30)


def test_encode_stream_raises_the_sources_first_error_before_any_bytes():
    from engine.audio_stream import OutputSpec, encode_stream
    from engine.errors import InputError

    def failing():
        raise InputError("text is empty")
        yield  # a generator

    with pytest.raises(InputError, match="empty"):
        next(encode_stream(failing(), 44100, OutputSpec("mp3")))


@pytest.mark.parametrize("speed, chain", [(1.5, "atempo=1.5"), (4.0, "atempo=2,atempo=2"),
                                          (0.25, "atempo=0.5,atempo=0.5"), (3.0, "atempo=2,atempo=1.5")])
def test_atempo_chain_keeps_each_filter_in_range(speed, chain):
    from engine.audio_stream import atempo_chain

    assert atempo_chain(speed) == chain


@pytest.mark.parametrize("buffer, ready, rest", [
    ("Hello there, ", "", "Hello there, "),
    ("First one. Second", "First one.", " Second"),
    ("Done! Really?", "Done! Really?", ""),
    ("Version 2.5 is out", "", "Version 2.5 is out"),  # a dot inside a number ends nothing
    ("你好。再见", "你好。", "再见"),
])
def test_live_session_speaks_complete_sentences(buffer, ready, rest):
    from app.routes_live import split_complete

    assert split_complete(buffer, 200) == (ready, rest)


def test_live_session_cuts_ready_text_to_the_servers_limit():
    from app.routes_live import within_limit

    assert within_limit("One. Two. Three.", 0) == ["One. Two. Three."]
    assert within_limit("One. Two. Three.", 10) == ["One. Two.", "Three."]  # after a sentence end
    assert within_limit("one two three four", 9) == ["one two", "three", "four"]  # else at a space
    assert within_limit("abcdefghij", 4) == ["abcd", "efgh", "ij"]  # else at the limit
    assert within_limit("It is 2.5 m. Then", 8) == ["It is", "2.5 m.", "Then"]  # a number's dot ends nothing
    assert all(len(piece) <= 37 for piece in within_limit("A sentence the agent wrote at once. " * 60, 37))
