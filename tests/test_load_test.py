"""scripts/load_test.py against a real demo server: every level completes, the report is written."""

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_app_support import ROOT, DemoServer
from tests.test_gpu_monitor import fake_nvidia_smi, nvidia_smi_script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import load_test  # noqa: E402


def test_load_test_drives_the_server_and_reports_each_level(tmp_path):
    from engine.facade import TIMELINE_STAGES

    out = tmp_path / "load.json"
    with DemoServer(tmp_path) as server:
        assert load_test.main(["--url", server.url, "--levels", "1,3", "--requests-per-client", "2",
                               "--max-new-tokens", "8", "--reference-seconds", "1", "--json", str(out),
                               "--html", str(tmp_path / "load.html")]) == 0
    report = json.loads(out.read_text())
    assert [lv["streams"] for lv in report["levels"]] == [1, 3]
    args = _Args()
    args.clip_seed = report["clip_seed"]  # the run's own seed, chosen for it
    numbers = [r["n"] for lv in report["levels"] for r in lv["records"]]
    # Every measured request has its own text, seed and clip, none shared with the warm-up's.
    assert len(set(numbers)) == len(numbers) and min(numbers) >= load_test.WARM_REQUESTS
    for level in report["levels"]:
        assert level["errors"] == 0 and level["requests"] == 2 * level["streams"]
        assert all(r["status"] == 200 for r in level["records"])
        for record in level["records"]:
            # Each read's arrival (s after the request started) and audio (s): in order, the first
            # at the time to first audio, together all of the request's audio.
            times = [at for at, _ in record["arrivals"]]
            assert times == sorted(times) and abs(times[0] * 1000 - record["ttfa_ms"]) < 1.0
            assert abs(sum(seconds for _, seconds in record["arrivals"]) - record["audio_s"]) < 1e-3
            body, kind = load_test.request_body(record["n"], args), load_test.voice_kind(record["n"])
            assert ("reference_id" in body, "references" in body) == {
                "saved_voice": (True, False), "inline_clip": (False, True), "no_voice": (False, False)}[kind]
        for record in level["records"]:  # over HTTP from the answers' Server-Timing headers
            stages = record["stages_ms"]
            assert list(stages) == list(TIMELINE_STAGES) and all(ms >= 0 for ms in stages.values())
        ran = {load_test.voice_kind(r["n"]) for r in level["records"]}
        assert {kind for kind, summary in level["by_voice"].items() if summary} == ran
        if level["streams"] == 3:
            assert ran == set(load_test.VOICE_KINDS)  # saved voices, inline clips and the model's own voice all ran
    html = (tmp_path / "load.html").read_text()
    assert "<img" in html and "TTFA p50 ms, inline clip" in html


def test_a_server_timing_header_gives_each_stage_with_a_duration():
    header = "prepared;dur=6.9, started;dur=0.4, cache;desc=hit, voice_ready;dur=281, bad;dur=x"
    assert load_test.server_timing(header) == {"prepared": 6.9, "started": 0.4, "voice_ready": 281.0}
    assert load_test.server_timing("") == {}


def test_load_test_in_process_sends_the_same_requests_to_an_engine_here(tmp_path, monkeypatch):
    from engine.facade import TIMELINE_STAGES, TTSEngine

    configs, frozen = [], []
    from_config = TTSEngine.from_config
    monkeypatch.setattr(TTSEngine, "from_config", lambda config: (configs.append(config), from_config(config))[1])
    run_levels = load_test.run_levels  # measured with the start-up heap out of the collector's passes, as a server
    monkeypatch.setattr(load_test, "run_levels", lambda *a: (frozen.append(gc.get_freeze_count()), run_levels(*a))[1])
    fake_gpu = sys.platform != "win32"  # an nvidia-smi that reports one GPU at 1,755-1,980 MHz
    if fake_gpu:
        monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path)) + os.pathsep + os.environ["PATH"])
    out = tmp_path / "in-process.json"
    assert load_test.main(["--in-process", "--weights", "demo", "--cache-dir", str(tmp_path / "cache"),
                           "--levels", "3", "--requests-per-client", "1", "--max-new-tokens", "8",
                           "--reference-seconds", "1", "--engine-option", "max_batch_size=2",
                           "--engine-option", "decode_priority=off", "--json", str(out)]) == 0
    (config,) = configs
    assert config.max_batch_size == 2 and config.decode_priority is False
    assert frozen[0] > 0 and gc.get_freeze_count() == 0  # frozen while measured, not after
    report = json.loads(out.read_text())
    assert report["url"] == "in-process"
    (level,) = report["levels"]
    assert level["errors"] == 0 and level["ok"] == level["requests"] == 3
    assert {load_test.voice_kind(r["n"]) for r in level["records"]} == set(load_test.VOICE_KINDS)
    if fake_gpu:  # the engine's GPU (here) sampled while the level ran
        assert [(gpu["index"], gpu["sm_clock_mhz_min"]) for gpu in level["gpu"]] == [(0, 1755.0)]
    for record in level["records"]:
        assert record["arrivals"] and abs(sum(s for _, s in record["arrivals"]) - record["audio_s"]) < 1e-3
        # The engine's stages until the first audio, in order, within the client's wait for it.
        assert list(record["stages_ms"]) == list(TIMELINE_STAGES)
        assert all(ms >= 0 for ms in record["stages_ms"].values())
        assert sum(record["stages_ms"].values()) <= record["ttfa_ms"] + 0.1
    for kind, summary in level["by_voice"].items():
        (record,) = [r for r in level["records"] if load_test.voice_kind(r["n"]) == kind]
        assert {stage: p["p50"] for stage, p in summary["stages_ms"].items()} == pytest.approx(record["stages_ms"])


def test_the_script_runs_in_process_from_the_repository_as_documented(tmp_path):
    """`python scripts/load_test.py --in-process ...` from the repository root, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "scripts/load_test.py", "--in-process", "--weights", "demo", "--levels", "1",
                          "--requests-per-client", "1", "--max-new-tokens", "4", "--reference-seconds", "1",
                          "--cache-dir", str(tmp_path / "cache")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "1 streams:" in run.stdout


def test_engine_options_without_in_process_are_refused():
    for options in (["--weights", "demo"], ["--engine-option", "max_batch_size=2"]):
        with pytest.raises(SystemExit) as refused:
            load_test.main([*options, "--levels", "1"])
        assert refused.value.code == 2


def test_engine_options_are_the_launchers_variables_and_wrong_ones_explained():
    assert load_test.engine_options(["decode_priority=false", "max_batch_size=32", "compile=off"]) == {
        "S1_MINI_DECODE_PRIORITY": "false", "S1_MINI_MAX_BATCH_SIZE": "32", "S1_MINI_COMPILE": "off"}
    for wrong, says in [("nope=1", "one of EngineConfig's fields"), ("demo=true", "options of their own"),
                        ("decode_priority=maybe", "true or false"), ("max_batch_size=x", "a number"),
                        ("compile=sometimes", "compile must be one of"), ("decode_priority", "FIELD=VALUE")]:
        with pytest.raises(ValueError, match=says):
            load_test.engine_options([wrong])


def test_an_in_process_request_the_api_would_refuse_gets_the_api_s_status():
    class Engine:
        sample_rate = 44100

        def synthesize_stream(self, *args, **kwargs):
            raise AssertionError("the request should have been refused before the engine")

    record = load_test.one_request(load_test.EngineTarget(Engine()), 7, b'{"text": "hi", "temperature": 5}')
    assert record["status"] == 422 and "temperature" in record["error"]


class _Args:
    max_new_tokens = 8
    reference_seconds = 1.0
    distinct_clips = 0
    length_spread = 0.0
    clip_seed = 0


def test_underrun_counts_the_waits_of_a_listener_playing_in_real_time():
    from reports import underrun_seconds

    assert underrun_seconds([]) == 0.0
    assert underrun_seconds([(10.0, 1.0), (10.5, 1.0), (11.9, 1.0)]) == 0.0  # always ahead of playback
    # 1 s of audio at t=10 runs out at 11; the next arrives at 11.5 (0.5 s stall) and plays to 12.5;
    # the last arrives at 13 (another 0.5 s).
    assert abs(underrun_seconds([(10.0, 1.0), (11.5, 1.0), (13.0, 1.0)]) - 1.0) < 1e-9


def test_distinct_clips_bounds_the_inline_clips_a_level_sends():
    def clips(distinct_clips, requests=60):
        args = _Args()
        args.distinct_clips = distinct_clips
        return {load_test.request_body(n, args)["references"][0]["audio"]
                for n in range(requests) if load_test.voice_kind(n) == "inline_clip"}

    assert len(clips(0)) == 20  # every inline request its own clip
    assert len(clips(7)) == 7
    with pytest.raises(SystemExit):
        load_test.main(["--distinct-clips", "-1"])


def test_runs_with_other_clip_seeds_send_clips_the_server_has_not_heard():
    def clips(seed):
        args = _Args()
        args.clip_seed = seed
        return [load_test.request_body(n, args)["references"][0]["audio"]
                for n in range(30) if load_test.voice_kind(n) == "inline_clip"]

    assert clips(5) == clips(5)  # a seed sends the same clips again
    assert not set(clips(5)) & set(clips(6))  # another seed, none of them


def test_length_spread_varies_each_request_s_frames_the_same_way_on_every_run():
    args = _Args()
    args.max_new_tokens = 200
    assert {load_test.request_body(n, args)["max_new_tokens"] for n in range(50)} == {200}
    args.length_spread = 0.2
    frames = [load_test.request_body(n, args)["max_new_tokens"] for n in range(200)]
    assert frames == [load_test.request_body(n, args)["max_new_tokens"] for n in range(200)]
    assert min(frames) >= 160 and max(frames) <= 240 and len(set(frames)) > 30
    assert abs(sum(frames) / len(frames) - 200) < 6  # as much audio on average
    for bad in ("-0.1", "1"):
        with pytest.raises(SystemExit):
            load_test.main(["--length-spread", bad])


@pytest.mark.skipif(sys.platform == "win32", reason="the fake nvidia-smi is a shell script")
def test_a_level_without_gpu_samples_says_what_nvidia_smi_said(tmp_path, monkeypatch, capsys):
    failure = "NVIDIA-SMI has failed because it could not communicate with the driver."
    folder = nvidia_smi_script(tmp_path, f"echo '{failure}'\nexit 9\n")
    monkeypatch.setenv("PATH", str(folder) + os.pathsep + os.environ["PATH"])

    class Target:  # answers every request with half a second of audio at once
        def add_voice(self, voice, clip, transcript):
            pass

        def stream(self, body, stats):
            yield 0.5

    def run_level(target, clients, args, offset):
        time.sleep(0.2)  # the level runs while nvidia-smi fails
        return {"streams": clients, "requests": clients, "errors": 0, "rejected": 0, "audio_s_per_s": 1.0, "by_voice": {}}

    monkeypatch.setattr(load_test, "run_level", run_level)
    args = _Args()
    args.in_process, args.url, args.requests_per_client = True, "in-process", 1
    (level,) = load_test.run_levels(Target(), args, [2])
    assert "gpu" not in level
    assert level["gpu_problem"] == failure
    assert "no GPU samples: nvidia-smi said 'NVIDIA-SMI has failed" in capsys.readouterr().out
