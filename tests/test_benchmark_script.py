"""scripts/benchmark.py end to end on the tiny demo model (CPU): every stable JSON name is filled and
the HTML report has its plots. A check of the script, not a benchmark: timings are not asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_reports_every_stable_name_with_a_side_by_side_configuration(tmp_path):
    out, html = tmp_path / "bench.json", tmp_path / "bench.html"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--weights", "demo", "--device", "cpu",
         "--runs", "1", "--requests", "1", "--frames", "8", "--request-frames", "8", "--concurrency", "1,2",
         "--sweep-requests", "1", "--compare", "max_batch_size=2", "--json", str(out), "--html", str(html)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    for key in ("device", "torch", "commit"):
        assert report[key]
    single = report["single_stream"]
    assert single["frames_per_s"] > 0 and single["frames"] == 8
    assert 0 < single["ttfa_ms_p50"] <= single["ttfa_ms_p95"] and single["ttfa_clone_ms_p50"] > 0
    assert set(report["memory"]) >= {"after_load_gb", "peak_gb"}  # None on a CPU: no device allocator
    assert report["startup"]["cold_compile_s"] >= 0 and report["startup"]["warm_restart_s"] > 0
    # the demo on a CPU runs eager: nothing compiled
    assert report["startup"]["cold_torch_compile_s"] == {} and report["startup"]["cold_compiled_functions"] == {}
    assert set(report["latency_ms"]) == {"short_text", "voice_clone_10s"}
    assert [c["name"] for c in report["configurations"]] == ["base", "max_batch_size=2"]
    for config in report["configurations"]:
        levels = config["concurrency"]
        assert [lv["streams"] for lv in levels] == [1, 2]
        for lv in levels:
            assert lv["errors"] == 0 and lv["audio_s_per_s"] > 0
            assert lv["ttfa_ms_p50"] <= lv["ttfa_ms_p95"] and lv["rtf_p50"] <= lv["rtf_max"]
    assert "<img" in html.read_text()


def test_a_checkpoint_means_real_weights_and_never_goes_silently_unused():
    sys.path.insert(0, str(ROOT / "scripts"))
    import benchmark  # noqa: E402

    assert benchmark.parse_args([]).weights == "random"
    args = benchmark.parse_args(["--checkpoint", "checkpoints/openaudio-s1-mini"])
    assert args.weights == "real" and args.checkpoint == "checkpoints/openaudio-s1-mini"
    for weights in ("random", "demo"):
        with pytest.raises(SystemExit):
            benchmark.parse_args(["--weights", weights, "--checkpoint", "somewhere"])


def test_a_compared_configuration_names_only_settings_the_benchmark_passes_on():
    sys.path.insert(0, str(ROOT / "scripts"))
    import benchmark  # noqa: E402

    args = benchmark.parse_args(["--compare", "max-batch-size=1,compile=off", "--compare", "quantize=int8"])
    assert args.compare == [("max-batch-size=1,compile=off", {"max_batch_size": "1", "compile": "off"}),
                            ("quantize=int8", {"quantize": "int8"})]
    for bad in ("max_batch=1", "compile", "quantize=int8,typo=2"):  # would measure the base again under its name
        with pytest.raises(SystemExit):
            benchmark.parse_args(["--compare", bad])


def test_each_configuration_is_measured_with_its_own_settings_only():
    sys.path.insert(0, str(ROOT / "scripts"))
    import benchmark  # noqa: E402

    argv = ["--checkpoint", "ck", "--quantize=int8", "--runs", "2", "--compare", "weights=random", "--json", "o.json"]
    assert benchmark._without_options(argv, ("--checkpoint", "--quantize", "--compare", "--json")) == ["--runs", "2"]


def test_the_start_up_reports_the_stages_of_torch_compile():
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    import benchmark_phases  # noqa: E402

    torch._dynamo.reset()
    torch.compile(lambda x: (x.sin() * 2).sum())(torch.randn(8))
    stages = benchmark_phases.torch_compile_stages()
    assert set(stages) <= set(benchmark_phases.COMPILE_STAGES.values()) and stages["all"] > 0
    assert all(0 <= seconds <= stages["all"] for seconds in stages.values())


def test_the_start_up_reports_the_graphs_and_seconds_of_each_compiled_function():
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    import benchmark_phases  # noqa: E402

    def wave(x):
        return (x.sin() * 2).sum()

    def ramp(x):
        return x.cumsum(0)

    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()  # earlier tests' compiles in this process
    benchmark_phases.keep_every_compile_record()
    compiled_wave = torch.compile(wave, dynamic=False)
    for size in (8, 16):  # static shapes: a graph each
        compiled_wave(torch.randn(size))
    torch.compile(ramp)(torch.randn(4))
    functions = benchmark_phases.compiled_functions()
    assert functions["wave"]["graphs"] == 2 and functions["ramp"]["graphs"] == 1
    assert all(entry["seconds"] > 0 for entry in functions.values())
    seconds = [entry["seconds"] for entry in functions.values()]
    assert seconds == sorted(seconds, reverse=True)


def test_the_reported_commit_says_when_the_tree_differs_from_it(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import reports
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.delenv("S1_COMMIT", raising=False)
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):  # as a git hook would set them
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path either
    assert reports.project_commit(tmp_path) == "unknown"  # no repository here

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert reports.project_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert reports.project_commit(tmp_path) == head + "+modified"
    monkeypatch.setenv("S1_COMMIT", "abc1234")
    assert reports.project_commit(tmp_path) == "abc1234"


def test_a_level_names_the_audio_length_of_its_slowest_request():
    """A request with less audio than the first-audio wait runs slower than real time whatever the
    engine's speed: the summary says how long the slowest one was."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from reports import level_summary

    records = [{"ttfa_ms": 250.0, "rtf": 0.2, "audio_s": 10.0, "total_s": 2.0, "underrun_s": 0.0},
               {"ttfa_ms": 270.0, "rtf": 1.03, "audio_s": 0.28, "total_s": 0.2884, "underrun_s": 0.0},
               {"ttfa_ms": 240.0, "rtf": 0.3, "audio_s": 9.0, "total_s": 2.7, "underrun_s": 0.0}]
    summary = level_summary(records)
    assert summary["rtf_max"] == 1.03 and summary["rtf_max_audio_s"] == 0.28
    assert summary["faster_than_real_time"] == 2
    # 0.76 s of first-audio waits in 4.9884 s of requests
    assert summary["before_first_audio_pct"] == pytest.approx(100 * 0.76 / 4.9884)
