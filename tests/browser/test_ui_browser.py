"""The UI in a real headless Chromium (Debian's package) against `launch.py --demo`: each tab's main
flow and each bad input, as a user meets them.

Skips with the reason when Chromium or the playwright package is missing (scripts/test.sh installs
both). Every test saves screenshots under tests/_artifacts/ for a person to look at.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.test_app_support import DemoServer, assert_audio, requests_in_engine
from tests.waiting import wait_until

CHROMIUM = os.environ.get("S1_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "_artifacts"
GENERATION_TIMEOUT_MS = 90_000
MAX_TEXT = 2000  # EngineConfig.max_text_length's default, which launch.py keeps

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (browser tests drive Chromium with it)"
)
if not Path(CHROMIUM).is_file():
    pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium", allow_module_level=True)
expect = sync_api.expect

# The machine has no outside network: keep Chromium from trying to reach Google's services. The
# fake media flags give the page a microphone that plays a beep, with no permission prompt.
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
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]


def speech_like_wav(seconds: float, peak: float = 0.5) -> bytes:
    """A voiced tone with syllable-like loudness changes, 16-bit WAV at 22.05 kHz."""
    rate = 22050
    t = np.arange(int(seconds * rate)) / rate
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 3 * t)
    tone = np.sin(2 * np.pi * 150 * t) + 0.4 * np.sin(2 * np.pi * 300 * t) + 0.2 * np.sin(2 * np.pi * 450 * t)
    samples = peak * envelope * tone / np.abs(tone).max()
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with DemoServer(tmp_path_factory.mktemp("browser"), "--device", "cpu", "--no-compile") as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    files = {
        "good": ("speaker.wav", speech_like_wav(6.0)),
        "short": ("short.wav", speech_like_wav(2.4)),
        "quiet": ("quiet.wav", speech_like_wav(6.0, peak=0.005)),
        "not_audio": ("notes.mp3", b"These are meeting notes, not audio.\n" * 40),
    }
    paths = {}
    for kind, (name, data) in files.items():
        (folder / name).write_bytes(data)
        paths[kind] = folder / name
    return paths


def open_page(browser, server, width=1280, height=1000):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(server.url)
    page.wait_for_selector("#speak-text textarea", timeout=30_000)
    return page


@pytest.fixture
def page(browser, server):
    page = open_page(browser, server)
    yield page
    page.context.close()


def shot(page, name: str):
    ARTIFACTS.mkdir(exist_ok=True)
    page.wait_for_timeout(300)  # let transitions finish for the picture
    page.screenshot(path=str(ARTIFACTS / f"ui_{name}.png"), full_page=True)


def open_tab(page, name: str):
    tab = page.get_by_role("tab", name=name, exact=True)
    if tab.count() and tab.first.is_visible():
        tab.first.click()
    else:  # narrow screens put the last tabs in an overflow menu
        page.locator("button[aria-label='More tabs']").click()
        page.get_by_role("button", name=name, exact=True).last.click()


def set_number(page, elem_id: str, value):
    field = page.locator(f"#{elem_id} input[type=number]")
    field.fill(str(value))
    field.press("Tab")


def quick_settings(page, seed=0):
    """Short generations (16 frames) keep the CPU demo fast."""
    open_tab(page, "Advanced settings")
    set_number(page, "set-max_new_tokens", 16)
    set_number(page, "set-seed", seed)
    open_tab(page, "Speak")


def choose(page, dropdown_id: str, option: str):
    page.click(f"#{dropdown_id} input")
    page.get_by_role("option", name=option, exact=True).click()


def wait_stats(page):
    page.locator("#speak-stats").get_by_text("Real-time factor").wait_for(timeout=GENERATION_TIMEOUT_MS)


def fetch(page, locator) -> bytes:
    link = locator.locator("a").first
    link.wait_for(timeout=30_000)
    response = page.request.get(link.get_attribute("href"))
    assert response.ok
    return response.body()


def cell(page, table_id: str, row: int, column: int):
    return page.locator(f"#{table_id} [data-testid='cell-{row}-{column}']")


def wait_text(page, selector: str, text: str, timeout=30_000):
    page.wait_for_function(
        "([selector, text]) => { const e = document.querySelector(selector); return e && e.innerText.includes(text); }",
        arg=[selector, text], timeout=timeout,
    )


def playable(page, elem_id: str, timeout=30_000):
    """A non-streaming player (Gradio's waveform view) holds audio once it offers to play it."""
    page.locator(f"#{elem_id} button[aria-label='Play']").wait_for(timeout=timeout)


def error_text(page, elem_id: str) -> str:
    box = page.locator(f"#{elem_id}")
    box.wait_for(state="visible", timeout=GENERATION_TIMEOUT_MS)
    return box.inner_text()


def assert_no_toast_or_error_pill(page):
    assert page.locator(".toast-body").count() == 0
    assert page.locator(".error").filter(has_text="Error").count() == 0


# ----- Speak ---------------------------------------------------------------------------------------


def test_speak_streams_plays_downloads_and_lands_in_history(page):
    quick_settings(page)
    assert page.locator("#speak-download").is_hidden(), "no empty Download box before the first generation"
    assert "Speaking in the default voice" in page.locator("#voice-indicator").inner_text()
    choose(page, "speak-format", "mp3")
    page.fill("#speak-text textarea", "Hello from a real browser. This is the S1-mini Studio.")
    assert page.locator("#char-count").inner_text().startswith("54 / 2,000 characters")
    page.click("#generate")
    wait_stats(page)
    page.wait_for_function(
        "(() => { const a = document.querySelector('#speak-audio audio');"
        " return a && a.readyState >= 2 && a.duration > 0; })()",
        timeout=30_000,
    )
    page.evaluate("() => document.querySelector('#speak-audio audio').play()")
    page.wait_for_function(  # headless Chromium's audio clock can start late on a loaded machine
        "(() => { const a = document.querySelector('#speak-audio audio'); return a.error || a.currentTime > 0; })()",
        timeout=30_000,
    )
    played = page.evaluate(
        "() => { const a = document.querySelector('#speak-audio audio'); a.pause();"
        " return {time: a.currentTime, error: a.error && a.error.message}; }"
    )
    assert played["error"] is None and played["time"] > 0, played
    download = page.locator("#speak-download")
    assert ".mp3" in download.inner_text()
    samples = assert_audio(fetch(page, download))
    assert "Seed" in page.locator("#speak-stats").inner_text()
    assert_no_toast_or_error_pill(page)
    shot(page, "speak")

    open_tab(page, "History")
    wait_text(page, "#history-table", "Hello from a real browser")
    assert "mp3" in page.locator("#history-table").inner_text()
    cell(page, "history-table", 0, 1).click()
    page.locator("#history-download a").first.wait_for(timeout=10_000)
    replayed = assert_audio(fetch(page, page.locator("#history-download")))
    np.testing.assert_array_equal(replayed, samples)
    shot(page, "history")

    # Regenerate restores text, voice, format and seed, and makes the same audio again.
    # Back on the Speak tab once restored: the History tab opened before then would be left again.
    assert page.locator("#speak-text textarea").is_hidden()
    page.click("#regenerate")
    page.locator("#speak-text textarea").wait_for(state="visible", timeout=30_000)
    assert page.locator("#speak-text textarea").input_value().startswith("Hello from a real browser")
    open_tab(page, "History")
    cell(page, "history-table", 1, 1).wait_for(timeout=GENERATION_TIMEOUT_MS)  # the new generation's row
    seeds = [cell(page, "history-table", row, 4).inner_text() for row in (0, 1)]
    assert seeds[0] == seeds[1], seeds
    open_tab(page, "Speak")
    assert ".mp3" in page.locator("#speak-download").inner_text()
    again = assert_audio(fetch(page, page.locator("#speak-download")))
    np.testing.assert_array_equal(again, samples)

    # The history is the browser's: a new page in the same browser context still shows it.
    other = page.context.new_page()
    other.goto(page.url)
    other.wait_for_selector("#speak-text textarea", timeout=30_000)
    open_tab(other, "History")
    cell(other, "history-table", 1, 1).wait_for(timeout=30_000)

    # Clear history asks first: a "no" keeps both rows, a "yes" empties the table.
    other.once("dialog", lambda dialog: dialog.dismiss())
    other.click("#clear-history")
    other.wait_for_timeout(1_000)
    cell(other, "history-table", 1, 1).wait_for(timeout=5_000)
    other.once("dialog", lambda dialog: dialog.accept())
    other.click("#clear-history")
    other.wait_for_function("() => !document.querySelector('#history-table').innerText.includes('Hello from')",
                            timeout=30_000)


def speak(page, text: str):
    """Generate `text` and wait for its stats (a seed of 0 draws a new seed, so they change)."""
    stats = page.locator("#speak-stats")
    before = stats.inner_text() if stats.is_visible() else ""
    page.fill("#speak-text textarea", text)
    page.click("#generate")
    page.wait_for_function(
        "before => { const e = document.querySelector('#speak-stats');"
        " return e && e.innerText.includes('Real-time factor') && e.innerText !== before; }",
        arg=before, timeout=GENERATION_TIMEOUT_MS,
    )


def seed_box(page) -> str:
    open_tab(page, "Advanced settings")
    value = page.locator("#set-seed input[type=number]").input_value()
    open_tab(page, "Speak")
    return value


def test_regenerate_keeps_its_row_and_gives_the_settings_back(page):
    quick_settings(page)
    speak(page, "Alpha is spoken first.")
    speak(page, "Bravo is spoken second.")
    open_tab(page, "History")
    wait_text(page, "#history-table", "Bravo")
    cell(page, "history-table", 1, 1).click()  # Alpha, below Bravo
    page.locator("#history-download a").first.wait_for(timeout=10_000)
    for run in (1, 2):  # each run puts a new Alpha on top: the pick must stay on the entry, not the row
        open_tab(page, "History")
        page.click("#regenerate")
        page.locator("#speak-text textarea").wait_for(state="visible", timeout=30_000)
        assert page.locator("#speak-text textarea").input_value() == "Alpha is spoken first."
        open_tab(page, "History")
        cell(page, "history-table", 1 + run, 1).wait_for(timeout=GENERATION_TIMEOUT_MS)
        wait_text(page, "#history-table", "Alpha")
        assert cell(page, "history-table", 0, 1).inner_text().startswith("Alpha"), run
    assert seed_box(page) == "0", "Regenerate left its seed in Advanced settings for the next texts"
    assert_no_toast_or_error_pill(page)


def test_regenerate_refuses_an_unsaved_clip_that_is_gone(page, clips):
    quick_settings(page)
    open_tab(page, "Voice clone")
    upload_clip(page, clips["good"])
    page.fill("#ref-text textarea", "a voiced tone rising and falling")
    open_tab(page, "Speak")
    choose(page, "speak-voice", "Clip in the Voice clone tab (not saved)")
    speak(page, "Spoken in the unsaved clip.")
    open_tab(page, "Voice clone")
    page.fill("#ref-text textarea", "another transcript")
    open_tab(page, "History")
    cell(page, "history-table", 0, 1).click()
    page.click("#regenerate")
    assert "no longer there" in error_text(page, "history-error")
    assert cell(page, "history-table", 1, 1).count() == 0, "it ran anyway"
    assert_no_toast_or_error_pill(page)


def test_a_seed_out_of_range_is_refused_next_to_generate(page):
    quick_settings(page)
    speak(page, "A first generation that stays.")
    open_tab(page, "Advanced settings")
    set_number(page, "set-seed", -3)
    open_tab(page, "Speak")
    page.fill("#speak-text textarea", "Not spoken.")
    page.click("#generate")
    message = error_text(page, "speak-error")
    assert "Seed (Advanced settings) must be a whole number" in message and "-3" in message
    assert ".wav" in page.locator("#speak-download").inner_text()  # the earlier audio is kept
    assert_no_toast_or_error_pill(page)


def test_generate_says_it_is_busy_and_takes_no_second_click_meanwhile(page):
    quick_settings(page)
    speak(page, "A short first text.")
    open_tab(page, "History")
    cell(page, "history-table", 0, 1).click()
    regenerate = page.locator("#regenerate")
    expect(regenerate).to_be_enabled(timeout=10_000)
    open_tab(page, "Advanced settings")
    set_number(page, "set-max_new_tokens", 400)  # a run long enough to look at
    open_tab(page, "Speak")
    page.fill("#speak-text textarea", "A longer text, so that the run lasts a moment. " * 3)
    page.click("#generate")
    button = page.locator("#generate")
    expect(button).to_be_disabled(timeout=10_000)
    expect(button).to_have_text("Generating…")
    expect(regenerate).to_be_disabled()  # a second run beside this one would be out of Stop's reach
    wait_stats(page)
    expect(button).to_be_enabled(timeout=30_000)
    expect(button).to_have_text("Generate")
    expect(regenerate).to_be_enabled()  # its row is still picked
    assert_no_toast_or_error_pill(page)


def test_stop_ends_a_run_and_frees_the_engine(page, server):
    def held() -> float:  # the requests the engine holds
        return requests_in_engine(httpx.get(f"{server.url}/metrics", timeout=30).text)

    quick_settings(page, seed=1)
    speak(page, "An earlier text, whose file must not pass for the stopped run's.")
    expect(page.locator("#speak-download")).to_be_visible()
    open_tab(page, "Advanced settings")
    set_number(page, "set-max_new_tokens", 2000)
    open_tab(page, "Speak")
    stop = page.locator("#stop")
    expect(stop).to_be_hidden()  # the earlier run's end hides it, maybe a moment after its file shows
    # Nine chunks of text: 20-47 s of demo audio for every seed tried, far longer than the test waits.
    long_text = " ".join(f"This is sentence number {i} of a long text." for i in range(1, 36))
    page.fill("#speak-text textarea", long_text)
    page.click("#generate")
    expect(stop).to_be_visible(timeout=10_000)
    # The earlier file leaves when this run's audio starts to play (the player exists already).
    expect(page.locator("#speak-download")).to_be_hidden(timeout=GENERATION_TIMEOUT_MS)
    assert held() == 1
    open_tab(page, "History")  # picking a row meanwhile enables Regenerate, which refuses to start a second run
    cell(page, "history-table", 0, 1).click()
    page.click("#regenerate")
    assert "A text is being spoken" in error_text(page, "history-error")
    assert held() == 1
    open_tab(page, "Speak")
    stop.click()
    expect(page.locator("#generate")).to_be_enabled(timeout=GENERATION_TIMEOUT_MS)  # at the next chunk
    expect(page.locator("#generate")).to_have_text("Generate")
    expect(stop).to_be_hidden()
    assert page.locator("#speak-stats").inner_text().strip() == "Stopped."
    expect(page.locator("#speak-download")).to_be_hidden()  # no file of the stopped run, nor of the earlier one
    # The engine stopped generating, not only the page.
    wait_until(lambda: held() == 0, "the engine idle after the stop", 30, poll_s=0.2)
    assert_no_toast_or_error_pill(page)
    speak(page, "Generate works again after a stop.")
    open_tab(page, "History")
    wait_text(page, "#history-table", "Generate works again after a stop.")
    assert "sentence number" not in page.locator("#history-table").inner_text()  # nothing half made


def test_over_long_text_is_counted_and_refused_next_to_the_text(page):
    quick_settings(page)
    page.fill("#speak-text textarea", "a" * (MAX_TEXT + 5))
    counter = page.locator("#char-count .over")
    counter.wait_for(timeout=5_000)
    assert "2,005 / 2,000 characters" in counter.inner_text()
    page.click("#generate")
    message = error_text(page, "speak-error")
    assert "2,005 characters; the limit is 2,000" in message
    assert_no_toast_or_error_pill(page)
    shot(page, "speak_text_too_long")

    # The error stays until the next action, which clears it.
    page.fill("#speak-text textarea", "Short enough.")
    assert page.locator("#speak-error").is_visible()
    page.keyboard.press("Control+Enter")  # keyboard submit from the text box
    wait_stats(page)
    assert page.locator("#speak-error").is_hidden()


def test_empty_text_error_stays_next_to_generate(page):
    page.fill("#speak-text textarea", "   ")
    page.click("#generate")
    message = error_text(page, "speak-error")
    assert "text is empty" in message.lower() and "Traceback" not in message
    assert_no_toast_or_error_pill(page)


def test_narrow_screen_keeps_every_control_in_view(browser, server):
    page = open_page(browser, server, width=400, height=900)
    try:
        quick_settings(page)
        for elem_id in ("speak-voice", "speak-format", "generate"):
            box = page.locator(f"#{elem_id}").bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 400, (elem_id, box)
        page.fill("#speak-text textarea", "Narrow screens work too.")
        page.click("#generate")
        wait_stats(page)
        box = page.locator("#speak-download").bounding_box()
        assert box["width"] > 300, box
        shot(page, "speak_narrow")
        open_tab(page, "Batch")
        for elem_id in ("batch-voice", "batch-format", "batch-run"):
            box = page.locator(f"#{elem_id}").bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 400 and box["width"] > 300, (elem_id, box)
        open_tab(page, "System")
        page.locator("#system-stats").get_by_text("Memory in use").wait_for()
        shot(page, "system_narrow")
    finally:
        page.context.close()


# ----- Voice clone -------------------------------------------------------------------------------


def upload_clip(page, path: Path):
    """Upload `path` as the reference clip; returns the level check's report of it."""
    clear = page.locator("#ref-audio button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
        # The report of the clip before goes first: read at once, the next one could be the old.
        page.locator("#clip-check").wait_for(state="hidden", timeout=30_000)
    page.set_input_files("#ref-audio input[type=file]", str(path))
    page.locator("#clip-check").wait_for(state="visible", timeout=30_000)
    return page.locator("#clip-check").inner_text()


def test_non_audio_upload_is_refused_at_once_without_server_paths(page, clips):
    open_tab(page, "Voice clone")
    report = upload_clip(page, clips["not_audio"])
    assert "Cannot use this clip" in report and "not an audio file" in report
    assert "/tmp" not in report and "gradio" not in report
    page.fill("#ref-text textarea", "meeting notes")
    page.fill("#voice-name textarea", "notes")
    page.click("#save-voice")
    message = error_text(page, "save-error")
    assert "not an audio file" in message and "/tmp" not in message
    shot(page, "clone_not_audio")


def test_too_short_and_too_quiet_clips_warn_at_upload(page, clips):
    open_tab(page, "Voice clone")
    report = upload_clip(page, clips["short"])
    assert "Too short (2.4 s)" in report
    page.fill("#ref-text textarea", "a short tone")
    page.fill("#voice-name textarea", "short one")
    page.click("#save-voice")
    assert "needs at least 5 s" in error_text(page, "save-error")
    assert "Speaking in the default voice" in page.locator("#voice-indicator").inner_text()
    shot(page, "clone_too_short")

    assert "Too quiet" in upload_clip(page, clips["quiet"])
    shot(page, "clone_too_quiet")


def test_microphone_recording_gets_a_level_check(page):
    open_tab(page, "Voice clone")
    page.locator("#ref-audio button[aria-label='Record audio']").click()
    page.locator("#ref-audio").get_by_role("button", name="Record", exact=False).first.click()
    page.wait_for_timeout(2_500)  # the fake microphone's beeps are recorded for this long
    page.locator("#ref-audio").get_by_role("button", name="Stop", exact=False).first.click()
    page.locator("#clip-check").wait_for(state="visible", timeout=30_000)
    report = page.locator("#clip-check").inner_text()
    assert "Too short" in report  # a 2.5 s recording: the level check ran on the recorded clip
    shot(page, "clone_microphone")


def test_clone_save_then_speak_in_the_saved_voice(page, clips, server):
    quick_settings(page)
    open_tab(page, "Voice clone")
    assert "Clip OK: 6.0 s" in upload_clip(page, clips["good"])
    # Uploading does not switch the voice Speak uses.
    assert "Speaking in the default voice" in page.locator("#voice-indicator").inner_text()

    page.fill("#voice-name textarea", "narrator")
    page.click("#save-voice")
    assert "transcript" in error_text(page, "save-error")  # no transcript typed yet
    shot(page, "clone_no_transcript")

    page.fill("#ref-text textarea", "a voiced tone rising and falling")
    page.click("#preview")
    playable(page, "preview-audio", GENERATION_TIMEOUT_MS)
    page.click("#save-voice")
    page.locator("#save-status").get_by_text("Saved voice narrator").wait_for(timeout=30_000)
    assert "Speak now uses it" in page.locator("#save-status").inner_text()
    assert page.locator("#save-error").is_hidden()
    # The manager shows the saved clip; Speak now uses the new voice and says so.
    wait_text(page, "#saved-voices", "narrator")
    playable(page, "picked-audio")
    wait_text(page, "#voice-indicator", "saved voice “narrator”")
    shot(page, "clone_saved")

    open_tab(page, "Speak")
    page.fill("#speak-text textarea", "Speaking in the saved voice.")
    page.click("#generate")
    wait_stats(page)
    assert_audio(fetch(page, page.locator("#speak-download")))

    open_tab(page, "Voice clone")
    page.fill("#rename-to textarea", "storyteller")
    page.click("#rename")
    page.locator("#manage-status").get_by_text("Renamed narrator to storyteller").wait_for(timeout=30_000)
    wait_text(page, "#voice-indicator", "saved voice “storyteller”")
    page.locator("#picked-voice input").fill("")  # nothing picked, then a click on its row picks it
    cell(page, "saved-voices", 0, 0).click()
    page.wait_for_function("() => document.querySelector('#picked-voice input').value === 'storyteller'",
                           timeout=30_000)
    # Delete asks first: a "no" keeps the voice, a "yes" deletes it.
    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    page.click("#delete")
    page.wait_for_timeout(1_000)
    assert questions == ["Delete the saved voice “storyteller”? This cannot be undone."]
    assert "storyteller" in page.locator("#saved-voices").inner_text()
    assert "Deleted" not in page.locator("#manage-status").inner_text()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    page.locator("#manage-status").get_by_text("Deleted storyteller").wait_for(timeout=30_000)
    wait_text(page, "#voice-indicator", "Speaking in the default voice")


# ----- Batch, settings, system --------------------------------------------------------------------


def test_batch_table_zip_and_row_playback(page):
    quick_settings(page)
    open_tab(page, "Batch")
    assert page.locator("#batch-zip").is_hidden()
    page.fill("#batch-lines textarea", "First line of the batch.\nSecond line.")
    choose(page, "batch-format", "flac")
    page.click("#batch-run")
    # One progress bar, on the table only (not on the zip's box too).
    progress = page.get_by_text(re.compile(r"Generating|processing|queue", re.I))
    progress.first.wait_for(timeout=30_000)
    assert progress.count() == 1, progress.all_inner_texts()
    wait_text(page, "#batch-table", "Second line.", GENERATION_TIMEOUT_MS)
    assert page.locator("#batch-table th").nth(3).inner_text().strip() == "audio length (s)"
    archive = page.locator("#batch-zip")
    archive.wait_for(state="visible", timeout=30_000)
    with zipfile.ZipFile(io.BytesIO(fetch(page, archive))) as z:
        names = sorted(z.namelist())
        assert len(names) == 2 and all(n.endswith(".flac") for n in names)
        for name in names:
            assert_audio(z.read(name))
    cell(page, "batch-table", 1, 1).click()
    playable(page, "batch-item")
    shot(page, "batch")

    # A row too long to speak keeps its status in view: the table shows its text cut short.
    page.fill("#batch-lines textarea", "Short line.\n" + "A very long line. " * 120)
    page.click("#batch-run")
    wait_text(page, "#batch-table", "error: text is", GENERATION_TIMEOUT_MS)
    status = cell(page, "batch-table", 1, 2)
    assert "characters, over this server's limit of 2000" in status.inner_text()
    box = status.bounding_box()
    assert box["x"] + 40 <= 1280, box

    page.fill("#batch-lines textarea", "")
    page.click("#batch-run")
    assert "nothing to speak" in error_text(page, "batch-error").lower()
    assert_no_toast_or_error_pill(page)
    shot(page, "batch_empty")


def test_advanced_settings_follow_the_reference_ui(page):
    open_tab(page, "Advanced settings")
    expected = {
        "set-temperature": ("0.7", "1", "0.8"),
        "set-top_p": ("0.7", "0.95", "0.8"),
        "set-repetition_penalty": ("1", "1.2", "1.1"),
        "set-chunk_length": ("100", "400", "300"),
    }
    for elem_id, (low, high, value) in expected.items():
        slider = page.locator(f"#{elem_id} input[type=range]")
        assert (slider.get_attribute("min"), slider.get_attribute("max"), slider.input_value()) == (low, high, value)
        assert page.locator(f"#{elem_id}").inner_text().count(".") >= 1  # the one-line hint is there
    assert page.locator("#set-seed input").input_value() == "0"
    shot(page, "settings")


def test_system_tab_explains_memory_on_cpu(page):
    open_tab(page, "System")
    wait_text(page, "#system-stats", "Memory in use")
    text = page.locator("#system-stats").inner_text()
    assert "cpu" in text and "n/a (measured on CUDA GPUs only)" in text
    shot(page, "system")

