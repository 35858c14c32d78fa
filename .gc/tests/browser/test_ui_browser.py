"""The UI in a real headless Chromium (Debian's package) against `launch.py --demo`: type, click
Generate, get playable audio and a download; errors appear as readable messages.

Skips with the reason when Chromium or the playwright package is missing (.ci/run installs both).
A screenshot is saved under tests/_artifacts/ for a person to look at.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.test_app_support import DemoServer, assert_audio

CHROMIUM = os.environ.get("S1_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "_artifacts"
GENERATION_TIMEOUT_MS = 90_000

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (browser tests drive Chromium with it)"
)
if not Path(CHROMIUM).is_file():
    pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium", allow_module_level=True)

# The machine has no outside network: keep Chromium from trying to reach Google's services.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with DemoServer(tmp_path_factory.mktemp("browser")) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    page.goto(server.url)
    page.wait_for_selector("#speak-text textarea", timeout=30_000)
    yield page
    context.close()


def test_type_generate_and_play(page, server):
    page.fill("#speak-text textarea", "Hello from a real browser. This is the S1-mini Studio.")
    page.click("#generate")
    stats = page.locator("#speak-stats")
    stats.get_by_text("Real-time factor").wait_for(timeout=GENERATION_TIMEOUT_MS)
    # The player holds audio the browser can decode (buffered, with a duration) and can start it.
    page.wait_for_function(
        "(() => { const a = document.querySelector('#speak-audio audio');"
        " return a && a.readyState >= 2 && a.duration > 0; })()",
        timeout=30_000,
    )
    played = page.evaluate(
        "async () => { const a = document.querySelector('#speak-audio audio');"
        " await a.play(); await new Promise(r => setTimeout(r, 300)); a.pause();"
        " return {time: a.currentTime, error: a.error && a.error.message}; }"
    )
    assert played["error"] is None and played["time"] > 0, played

    link = page.locator("#speak-download a").first
    link.wait_for(timeout=10_000)
    download = page.request.get(link.get_attribute("href"))
    assert download.ok
    assert_audio(download.body())

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui_speak.png"), full_page=True)


def test_error_is_a_readable_message(page):
    page.fill("#speak-text textarea", "   ")
    page.click("#generate")
    toast = page.locator(".toast-body").first
    toast.wait_for(timeout=30_000)
    text = toast.inner_text()
    assert "text is empty" in text and "Traceback" not in text
    page.wait_for_timeout(500)  # let the toast finish fading in for the screenshot
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui_error.png"))
