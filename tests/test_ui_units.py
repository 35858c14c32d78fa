"""The UI's helpers without a server: clip checks, where history files may come from, the history
list, and how errors reach the page and the API."""

from __future__ import annotations

import logging

import gradio as gr
import numpy as np
import pytest
import soundfile as sf

from app.clip_check import check_clip, level_warnings
from app.metrics import Metrics
from app.outputs import OutputDir
from app.ui_errors import api_endpoint, ui_action
from app.ui_handlers import HISTORY_LIMIT, Handlers, _safe_name, concrete_seed
from engine.errors import InputError

RATE = 22050


def wav(tmp_path, seconds: float, peak: float = 0.5, name: str = "clip.wav") -> str:
    t = np.arange(int(seconds * RATE)) / RATE
    samples = peak * np.sin(2 * np.pi * 200 * t)
    path = tmp_path / name
    sf.write(path, samples.astype(np.float32), RATE, subtype="PCM_16")
    return str(path)


def test_a_good_clip_passes(tmp_path):
    report = check_clip(wav(tmp_path, 8.0), max_seconds=90)
    assert report.error is None and report.warnings == () and not report.too_short
    assert "Clip OK: 8.0 s" in report.markdown()


def test_no_clip_is_no_report():
    assert check_clip(None, max_seconds=90) is None


def test_a_short_clip_warns_and_cannot_be_saved(tmp_path):
    report = check_clip(wav(tmp_path, 2.4), max_seconds=90)
    assert report.too_short and "Too short (2.4 s)" in report.warnings[0]


def test_a_long_clip_gets_a_hint_and_one_over_the_limit_is_refused(tmp_path):
    assert "Long clip (40 s)" in check_clip(wav(tmp_path, 40.0), max_seconds=90).warnings[0]
    refused = check_clip(wav(tmp_path, 12.0, name="long.wav"), max_seconds=10)
    assert refused.error and "the limit is 10 s" in refused.error


def test_a_file_that_is_not_audio_is_refused_without_its_path(tmp_path):
    path = tmp_path / "notes.mp3"
    path.write_text("not audio at all\n" * 50)
    report = check_clip(str(path), max_seconds=90)
    assert "not an audio file" in report.error
    assert str(tmp_path) not in report.error and "pipe:" not in report.error


def test_level_warnings_for_quiet_and_clipped_audio():
    t = np.arange(RATE * 6) / RATE
    tone = np.sin(2 * np.pi * 200 * t).astype(np.float32)
    assert level_warnings(0.5 * tone) == []
    assert "Too quiet" in level_warnings(0.003 * tone)[0]
    assert "Clipped" in level_warnings(np.clip(3 * tone, -1, 1))[0]


def test_history_files_resolve_only_inside_the_output_folder(tmp_path):
    outputs = OutputDir(tmp_path / "out")
    run = outputs.new_run()
    (run / "a.wav").write_bytes(b"RIFF")
    (tmp_path / "secret.txt").write_text("no")
    assert outputs.resolve(f"{run.name}/a.wav") == run / "a.wav"
    for name in ("../secret.txt", f"{run.name}/../../secret.txt", str(tmp_path / "secret.txt"), f"{run.name}/b.wav",
                 "a.wav", f"{run.name}/a.wav/x", None):
        assert outputs.resolve(name) is None, name


def test_history_keeps_newest_first_without_duplicates_and_is_bounded():
    history = []
    for i in range(HISTORY_LIMIT + 5):
        history = Handlers.add_to_history(history, {"id": str(i)})
    history = Handlers.add_to_history(history, {"id": str(HISTORY_LIMIT + 4)})  # the same run again
    assert [e["id"] for e in history[:2]] == [str(HISTORY_LIMIT + 4), str(HISTORY_LIMIT + 3)]
    assert len(history) == HISTORY_LIMIT
    assert Handlers.add_to_history(history, None) == history


@pytest.mark.parametrize("seed", [-3, 2**31, 1.5, 99999999999])
def test_a_seed_that_is_not_a_whole_number_in_range_is_refused_naming_the_field(seed):
    with pytest.raises(InputError, match=r"Seed \(Advanced settings\) must be a whole number from 0"):
        concrete_seed(seed)


@pytest.mark.parametrize("text, name", [("Hello there!", "Hello_there"), ("Con", "Con_"), ("nul.", "nul_"),
                                        ("com1?", "com1_"), ("Console", "Console"), ("...", "audio")])
def test_output_file_names_keep_to_safe_characters_and_never_name_a_windows_device(text, name):
    assert _safe_name(text) == name


def test_seed_zero_picks_a_concrete_seed_others_stay():
    assert concrete_seed(42) == 42
    assert all(concrete_seed(0) > 0 for _ in range(20))


def test_page_errors_fill_the_box_and_api_errors_raise(caplog):
    caplog.set_level(logging.INFO, logger="app.ui")
    def speak(text):
        if not text:
            raise InputError("the text is empty")
        return f"said {text}"

    on_page = ui_action(speak, "ui/test", Metrics(), outputs=1)
    result, box = on_page("")
    assert isinstance(result, type(gr.skip())) and box.visible and "The text is empty" in box.value
    result, box = on_page("hi")
    assert result == "said hi" and not box.visible

    with pytest.raises(gr.Error, match="the text is empty"):
        api_endpoint(speak, "ui/test", Metrics())("")
    refused = [r for r in caplog.records if "ui/test refused (400)" in r.getMessage()]
    assert len(refused) == 2 and all(r.exc_info is None for r in refused)


def test_a_status_message_is_cleared_when_the_next_action_fails():
    def save(name):
        raise InputError("give the voice a name")

    status, box = ui_action(save, "ui/test", Metrics(), outputs=1, status_first=True)("")
    assert status == "" and "Give the voice a name" in box.value
