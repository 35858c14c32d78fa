"""The UI's API endpoints through gradio_client, against `launch.py --demo`: the same calls the
buttons make, with readable errors, and saved voices shared with the REST API."""

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

from tests.test_app_support import DemoServer, assert_audio, reference_clip_wav

SAMPLING = {
    "temperature": 0.8,
    "top_p": 0.8,
    "repetition_penalty": 1.1,
    "max_new_tokens": 16,
    "chunk_length": 100,
    "seed": 5,
}
ENDPOINTS = {
    "/speak": ["text", "voice", "reference_audio", "reference_text", *SAMPLING],
    "/preview_voice": ["reference_audio", "reference_text", "preview_text", *SAMPLING],
    "/batch": ["lines", "upload", "voice", "reference_audio", "reference_text", *SAMPLING],
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
    path.write_bytes(reference_clip_wav())
    return str(path)


def speak(client, text, voice="<none>", reference_audio=None, reference_text=""):
    return client.submit(text, voice, reference_audio, reference_text, **SAMPLING, api_name="/speak")


def test_api_names_and_parameters_are_stable(client):
    named = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    for name, params in ENDPOINTS.items():
        assert name in named, name
        assert [p["parameter_name"] for p in named[name]["parameters"]] == params


def test_speak_streams_then_offers_the_whole_file_and_stats(client):
    job = speak(client, "Hello from gradio client.")
    outputs = list(job)
    assert len(outputs) >= 2, "expected a streamed chunk before the final output"
    _, download, stats = job.result()
    assert_audio(Path(download).read_bytes())
    assert download.endswith(".wav")
    for words in ("Audio", "Real-time factor", "Time to first audio"):
        assert words in stats


def test_speak_errors_are_readable_messages(client, clip):
    with pytest.raises(AppError, match="text is empty") as caught:
        client.predict("", "<none>", None, "", **SAMPLING, api_name="/speak")
    assert "Traceback" not in str(caught.value)
    with pytest.raises(AppError, match="transcript"):
        client.predict("Hi.", "<uploaded>", handle_file(clip), " ", **SAMPLING, api_name="/speak")
    with pytest.raises(AppError, match="upload or record a reference"):
        client.predict("Hi.", "<uploaded>", None, "words", **SAMPLING, api_name="/speak")


def test_speak_with_the_uploaded_reference(client, clip):
    job = speak(client, "Speaking in the uploaded voice.", "<uploaded>", handle_file(clip), "a gliding tone")
    assert_audio(Path(job.result()[1]).read_bytes())


def test_preview_voice(client, clip):
    path = client.predict(
        handle_file(clip), "a gliding tone", "Preview sentence.", **SAMPLING, api_name="/preview_voice"
    )
    assert_audio(Path(path).read_bytes())


def test_saved_voices_are_shared_with_the_rest_api(client, server, clip):
    assert "ui voice" in client.predict("ui voice", handle_file(clip), "a gliding tone", api_name="/save_voice")
    rest = httpx.get(f"{server.url}/v1/references/list").json()["reference_ids"]
    assert "ui voice" in rest
    assert ["ui voice", "a gliding tone"] in client.predict(api_name="/list_voices")

    assert_audio(Path(speak(client, "Saved voice speaking.", "ui voice").result()[1]).read_bytes())

    with pytest.raises(AppError, match="already exists"):
        client.predict("ui voice", handle_file(clip), "a gliding tone", api_name="/save_voice")
    client.predict("ui voice", "ui voice 2", api_name="/rename_voice")
    client.predict("ui voice 2", api_name="/delete_voice")
    assert httpx.get(f"{server.url}/v1/references/list").json()["reference_ids"] == []
    with pytest.raises(AppError, match="no saved voice"):
        client.predict("ui voice 2", api_name="/delete_voice")


def test_batch_from_lines_gives_table_and_zip(client):
    table, archive = client.predict(
        "First line.\n\n  \nSecond line.", None, "<none>", None, "", **SAMPLING, api_name="/batch"
    )
    assert table["headers"] == ["#", "text", "status", "seconds"]
    assert [row[:3] for row in table["data"]] == [[1, "First line.", "ok"], [2, "Second line.", "ok"]]
    with zipfile.ZipFile(archive) as z:
        names = sorted(z.namelist())
        assert len(names) == 2 and all(n.endswith(".wav") for n in names)
        for name in names:
            assert_audio(z.read(name))


def test_batch_from_csv_upload(client, tmp_path):
    csv_path = tmp_path / "lines.csv"
    csv_path.write_text('id,text\n1,From a CSV file.\n2,"Second, with a comma."\n', encoding="utf-8")
    table, _ = client.predict("", handle_file(str(csv_path)), "<none>", None, "", **SAMPLING, api_name="/batch")
    assert [row[1] for row in table["data"]] == ["From a CSV file.", "Second, with a comma."]


def test_batch_with_nothing_to_say(client):
    with pytest.raises(AppError, match="nothing to speak"):
        client.predict("  \n ", None, "<none>", None, "", **SAMPLING, api_name="/batch")


def test_system_shows_the_engine(client):
    text = client.predict(api_name="/system")
    for words in ("Device | cpu", "Precision | fp32", "Compile", "Queue depth", "of 4 at once", "Frames/s"):
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
        job = speak(client, "Streaming with the wheel's ffmpeg.")
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
        audio, download, _ = client.predict("No ffmpeg here.", "<none>", None, "", **SAMPLING, api_name="/speak")
        client.close()
    assert not audio.endswith(".m3u8")
    np.testing.assert_array_equal(assert_audio(Path(audio).read_bytes()), assert_audio(Path(download).read_bytes()))
