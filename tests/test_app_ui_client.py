"""The UI's API endpoints through gradio_client, against `launch.py --demo`: the same calls the
buttons make, with readable errors, saved voices shared with the REST API, and a schema that lists
the real choices."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from tests.test_app_support import DemoServer, assert_audible, assert_audio, decode, reference_clip_wav

SAMPLING = {
    "temperature": 0.8,
    "top_p": 0.8,
    "repetition_penalty": 1.1,
    "max_new_tokens": 16,
    "chunk_length": 100,
    "seed": 5,
}
ENDPOINTS = {
    "/speak": ["text", "voice", "output_format", "reference_audio", "reference_text", *SAMPLING],
    "/speak_stream": ["text", "voice", "output_format", "reference_audio", "reference_text", *SAMPLING],
    "/preview_voice": ["reference_audio", "reference_text", "preview_text", *SAMPLING],
    "/batch": ["lines", "upload", "voice", "output_format", "reference_audio", "reference_text", *SAMPLING],
    "/save_voice": ["name", "reference_audio", "reference_text"],
    "/rename_voice": ["old", "new"],
    "/delete_voice": ["name"],
    "/list_voices": [],
    "/system": [],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with DemoServer(tmp_path_factory.mktemp("ui")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = Client(server.url, verbose=False)
    yield c
    c.close()


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("clip") / "reference.wav"
    path.write_bytes(reference_clip_wav(seconds=6.0))  # a saved voice needs 5 s at least
    return str(path)


def speak(client, text, voice="<none>", output_format="wav", reference_audio=None, reference_text=""):
    return client.predict(
        text, voice, output_format, reference_audio, reference_text, **SAMPLING, api_name="/speak"
    )


def parameters(client, endpoint: str) -> dict[str, dict]:
    named = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    return {p["parameter_name"]: p for p in named[endpoint]["parameters"]}


def test_api_names_and_parameters_are_stable(client):
    named = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    for name, params in ENDPOINTS.items():
        assert name in named, name
        assert [p["parameter_name"] for p in named[name]["parameters"]] == params


def test_speak_with_text_alone_returns_the_audio_file_first(client):
    required = [name for name, p in parameters(client, "/speak").items() if not p["parameter_has_default"]]
    assert required == ["text"]
    audio, stats = client.predict("Hello from gradio client.", api_name="/speak")
    assert audio.endswith(".wav")
    assert_audio(Path(audio).read_bytes())
    for words in ("Audio", "Real-time factor", "Time to first audio", "Seed"):
        assert words in stats


@pytest.mark.parametrize("output_format", ["mp3", "flac", "opus"])
def test_speak_in_each_offered_format(client, output_format):
    assert output_format in parameters(client, "/speak")["output_format"]["type"]["enum"]
    audio, _ = speak(client, "A compressed download.", output_format=output_format)
    assert audio.endswith(f".{output_format}")
    samples, rate = decode(Path(audio).read_bytes())
    assert rate == (48000 if output_format == "opus" else 44100)
    assert_audible(samples, 0.04, rate)


def test_speak_stream_streams_then_offers_the_whole_file_and_stats(client):
    job = client.submit("Hello from gradio client.", output_format="flac", **SAMPLING, api_name="/speak_stream")
    outputs = list(job)
    assert len(outputs) >= 2, "expected a streamed chunk before the final output"
    _, download, stats = job.result()
    assert download.endswith(".flac")
    assert_audio(Path(download).read_bytes())
    assert "Real-time factor" in stats


def test_the_same_seed_gives_the_same_audio(client):
    first, stats = speak(client, "Say it twice.")
    second, _ = speak(client, "Say it twice.")
    assert f"**Seed** {SAMPLING['seed']}" in stats
    np.testing.assert_array_equal(decode(Path(first).read_bytes())[0], decode(Path(second).read_bytes())[0])


def test_speak_errors_are_readable_messages(client, clip, server):
    with pytest.raises(AppError, match="text is empty") as caught:
        speak(client, "")
    assert "Traceback" not in str(caught.value)
    with pytest.raises(AppError, match="the limit is 2,000"):
        speak(client, "a" * 2001)
    with pytest.raises(AppError, match="transcript"):
        speak(client, "Hi.", "<uploaded>", reference_audio=handle_file(clip), reference_text=" ")
    with pytest.raises(AppError, match="upload or record a reference"):
        speak(client, "Hi.", "<uploaded>", reference_text="words")
    # A caller's mistake is one log line, not a traceback.
    log = server.log_tail(20_000)
    assert "ui/speak refused (400): the text is" in log and "Traceback" not in log


def test_speak_with_the_uploaded_reference(client, clip):
    audio, _ = speak(
        client, "Speaking in the uploaded voice.", "<uploaded>", "wav", handle_file(clip), "a gliding tone"
    )
    assert_audio(Path(audio).read_bytes())


def test_a_clip_that_is_not_audio_is_refused_without_a_server_path(client, tmp_path):
    notes = tmp_path / "notes.wav"
    notes.write_text("meeting notes, not audio\n" * 20)
    with pytest.raises(AppError, match="not an audio file") as caught:
        client.predict("notes", handle_file(str(notes)), "words", api_name="/save_voice")
    assert "/tmp" not in str(caught.value) and "gradio" not in str(caught.value)


def test_a_too_short_clip_cannot_be_saved(client, tmp_path):
    short = tmp_path / "short.wav"
    short.write_bytes(reference_clip_wav(seconds=2.0))
    with pytest.raises(AppError, match="needs at least 5 s"):
        client.predict("short", handle_file(str(short)), "a gliding tone", api_name="/save_voice")


def test_preview_voice(client, clip):
    path = client.predict(
        handle_file(clip), "a gliding tone", "Preview sentence.", **SAMPLING, api_name="/preview_voice"
    )
    assert_audio(Path(path).read_bytes())


def test_saved_voices_are_shared_with_the_rest_api(client, server, clip):
    status = client.predict("ui voice", handle_file(clip), "a gliding tone", api_name="/save_voice")
    assert "ui voice" in status and "Speak" not in status  # no page's Speak tab switched for an API caller
    rest = httpx.get(f"{server.url}/v1/references/list", params={"format": "json"}).json()["reference_ids"]
    assert "ui voice" in rest
    assert ["ui voice", "a gliding tone"] in client.predict(api_name="/list_voices")

    # Without an API key the schema lists the saved voices wherever a voice is named.
    fresh = Client(server.url, verbose=False)
    assert "ui voice" in parameters(fresh, "/speak")["voice"]["type"]["enum"]
    assert "ui voice" in parameters(fresh, "/batch")["voice"]["type"]["enum"]
    assert parameters(fresh, "/rename_voice")["old"]["type"]["enum"] == ["ui voice"]
    assert parameters(fresh, "/delete_voice")["name"]["type"]["enum"] == ["ui voice"]
    fresh.close()

    assert_audio(Path(speak(client, "Saved voice speaking.", "ui voice")[0]).read_bytes())

    with pytest.raises(AppError, match="already exists"):
        client.predict("ui voice", handle_file(clip), "a gliding tone", api_name="/save_voice")
    with pytest.raises(AppError, match="already has that name"):
        client.predict("ui voice", " ui voice ", api_name="/rename_voice")
    client.predict("ui voice", "ui voice 2", api_name="/rename_voice")
    client.predict("ui voice 2", api_name="/delete_voice")
    assert httpx.get(f"{server.url}/v1/references/list", params={"format": "json"}).json()["reference_ids"] == []
    fresh = Client(server.url, verbose=False)
    assert parameters(fresh, "/delete_voice")["name"]["type"]["enum"] == []
    fresh.close()
    with pytest.raises(AppError, match="no saved voice"):
        client.predict("ui voice 2", api_name="/delete_voice")


def test_batch_from_lines_gives_table_and_zip(client):
    table, archive = client.predict(
        "First line.\n\n  \nSecond line.", None, "<none>", "wav", None, "", **SAMPLING, api_name="/batch"
    )
    assert table["headers"] == ["#", "text", "status", "audio length (s)"]
    assert [row[:3] for row in table["data"]] == [[1, "First line.", "ok"], [2, "Second line.", "ok"]]
    with zipfile.ZipFile(archive) as z:
        names = sorted(z.namelist())
        assert len(names) == 2 and all(n.endswith(".wav") for n in names)
        for name in names:
            assert_audio(z.read(name))


def test_batch_from_csv_upload(client, tmp_path):
    csv_path = tmp_path / "lines.csv"
    csv_path.write_text('id,text\n1,From a CSV file.\n2,"Second, with a comma."\n', encoding="utf-8")
    table, _ = client.predict("", handle_file(str(csv_path)), **SAMPLING, api_name="/batch")
    assert [row[1] for row in table["data"]] == ["From a CSV file.", "Second, with a comma."]


@pytest.mark.parametrize("endpoint, data", [
    ("batch", ["", "FILE", "<none>", "wav", None, "", *SAMPLING.values()]),
    ("speak", ["Hi.", "<none>", "wav", "FILE", "some words", *SAMPLING.values()]),
])
def test_a_file_path_that_no_upload_made_is_refused(server, tmp_path, endpoint, data):
    # Gradio's HTTP API, as any client may call it: a file input naming a path instead of an upload.
    secret = tmp_path / "secret.txt"  # on the server's machine, outside Gradio's upload folder
    secret.write_text("top secret line\n", encoding="utf-8")
    named = {"path": str(secret), "meta": {"_type": "gradio.FileData"}}
    body = {"data": [named if value == "FILE" else value for value in data]}
    with httpx.Client(base_url=f"{server.url}/gradio_api", timeout=120) as http:
        event = http.post(f"/call/{endpoint}", json=body).json()["event_id"]
        answer = http.get(f"/call/{endpoint}/{event}").text
    assert "event: error" in answer and "top secret" not in answer, answer


def test_batch_with_nothing_to_say(client):
    with pytest.raises(AppError, match="nothing to speak"):
        client.predict("  \n ", api_name="/batch")


def test_system_shows_the_engine(client):
    text = client.predict(api_name="/system")
    for words in ("Device | cpu", "Precision | fp32", "Compile", "Queue depth", "of 4 at once", "Frames/s",
                  "n/a (measured on CUDA GPUs only)"):
        assert words in text


def python_only_path(tmp_path) -> dict[str, str]:
    """As on a Windows machine after the quickstart: no ffmpeg on PATH, which holds python only."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    return {"PATH": str(bin_dir), "XDG_CACHE_HOME": str(tmp_path / "user-cache")}


def test_with_no_ffmpeg_on_path_the_ui_streams_through_the_wheels_ffmpeg(tmp_path):
    with DemoServer(tmp_path, env=python_only_path(tmp_path)) as server:
        assert "ffmpeg: " in server.log_tail() and "(from the imageio-ffmpeg wheel; none on PATH)" in server.log_tail()
        client = Client(server.url, verbose=False)
        job = client.submit("Streaming with the wheel's ffmpeg.", **SAMPLING, api_name="/speak_stream")
        outputs = list(job)
        _, download, _ = job.result()
        client.close()
    assert len(outputs) >= 2, "expected a streamed chunk before the final output"
    assert outputs[0][0].endswith(".m3u8"), outputs[0]  # Gradio's stream playlist: ffmpeg encoded it
    assert_audio(Path(download).read_bytes())
    assert "Traceback" not in server.log_tail()


def test_without_any_ffmpeg_the_ui_returns_whole_clips(tmp_path):
    # No ffmpeg on PATH and the imageio-ffmpeg wheel missing (an import of it fails): Gradio cannot stream.
    blocker = tmp_path / "no-wheel" / "imageio_ffmpeg"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('imageio_ffmpeg is blocked in this test')\n")
    path = os.pathsep.join(filter(None, [str(blocker.parent), os.environ.get("PYTHONPATH")]))
    env = {**python_only_path(tmp_path), "PYTHONPATH": path}
    with DemoServer(tmp_path, env=env) as server:
        assert "no ffmpeg: not on PATH and the imageio-ffmpeg wheel is not installed" in server.log_tail()
        client = Client(server.url, verbose=False)
        formats = parameters(client, "/speak")["output_format"]["type"]["enum"]
        audio, _ = client.predict("No ffmpeg here.", **SAMPLING, api_name="/speak")
        client.close()
    assert audio.endswith(".wav")
    assert_audio(Path(audio).read_bytes())
    assert {"wav", "flac"} <= set(formats)
