"""With --api-key, nothing about the saved voices is readable before the UI login: not in the page
(window.gradio_api_info), not in the run-history page. After login the voices are there. Over HTTP
against `launch.py --demo --api-key`."""

from __future__ import annotations

import httpx
import pytest
from gradio_client import Client

from tests.test_app_support import DemoServer, reference_clip_wav

KEY = "ui-secret-key-51"
BEARER = {"authorization": f"Bearer {KEY}"}
VOICE = "private-voice-kestrel"
RENAMED = "private-voice-osprey"
PUBLIC_PAGES = ["/", "/gradio_api/runs", "/?page=", "/gradio_api/runs/"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The voice is there from the start, so the page's first render could carry it.
    folder = tmp_path_factory.mktemp("ui-auth")
    voice = folder / "voices" / VOICE
    voice.mkdir(parents=True)
    (voice / "sample.wav").write_bytes(reference_clip_wav(seconds=6.0))
    (voice / "sample.lab").write_text("a gliding tone", encoding="utf-8")
    with DemoServer(folder, "--api-key", KEY) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120, follow_redirects=True) as client:
        yield client


@pytest.fixture(scope="module")
def saved_voice(http):
    assert VOICE in http.get("/v1/references/list", headers={**BEARER, "accept": "application/json"}).json()["reference_ids"]
    return VOICE


def assert_nothing_leaks(http, *names: str):
    for path in PUBLIC_PAGES:
        page = http.get(path)
        assert page.status_code == 200, path
        assert "gradio_api_info" in page.text  # the page that once carried the choices
        for name in names:
            assert name not in page.text, f"{name!r} readable without login at {path}"


def test_pages_before_login_hold_no_voice_names(http, saved_voice):
    assert_nothing_leaks(http, saved_voice)


def test_after_login_the_voices_are_there_and_a_rename_leaks_neither_name(http, server, saved_voice):
    client = Client(server.url, auth=("anyone", KEY), verbose=False)
    try:
        assert [saved_voice, "a gliding tone"] in client.predict(api_name="/list_voices")
        # A logged-in page load fills the pickers; later anonymous pages still show nothing.
        with httpx.Client(base_url=server.url, timeout=60) as browser:
            assert browser.post("/login", data={"username": "anyone", "password": KEY}).status_code == 200
            assert saved_voice not in browser.get("/").text  # filled by a load event, not the config
        client.predict(saved_voice, RENAMED, api_name="/rename_voice")
        assert_nothing_leaks(http, saved_voice, RENAMED)
        client.predict(RENAMED, api_name="/delete_voice")
    finally:
        client.close()


def test_the_api_info_needs_a_login(http):
    assert http.get("/gradio_api/info").status_code == 401
