"""What the benchmark and the load test report about a run, and how they write it: percentiles,
each streamed request's record (time to first audio, real-time factor, how long a listener would
wait for audio), a level's summary, the machine and the code measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def percentiles(values: list[float]) -> dict:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)),
            "p99": float(np.percentile(arr, 99)), "mean": float(arr.mean()), "n": len(values)}


def underrun_seconds(arrivals: list[tuple[float, float]]) -> float:
    """How long a listener who starts playing at the first audio waits for audio that has not come:
    arrivals are (arrival time s, audio s) per chunk, in order."""
    stalled, runs_out = 0.0, arrivals[0][0] if arrivals else 0.0
    for at, seconds in arrivals:
        if at > runs_out:
            stalled += at - runs_out
            runs_out = at
        runs_out += seconds
    return stalled


def stream_record(started: float, arrivals: list[tuple[float, float]]) -> dict:
    """One streamed request, from its start and its chunks' (arrival time s, audio s): time to first
    audio, real-time factor and underrun (None where it produced no audio)."""
    total = time.perf_counter() - started
    audio_s = sum(seconds for _, seconds in arrivals)
    return {"ttfa_ms": (arrivals[0][0] - started) * 1000 if arrivals else None, "total_s": total,
            "audio_s": audio_s, "rtf": total / audio_s if audio_s else None, "underrun_s": underrun_seconds(arrivals)}


def level_summary(ok: list[dict]) -> dict:
    """Percentiles over the stream_records of the requests that produced audio ({} when none did)."""
    if not ok:
        return {}
    ttfa, rtf = percentiles([r["ttfa_ms"] for r in ok]), percentiles([r["rtf"] for r in ok])
    slowest = max(ok, key=lambda r: r["rtf"])
    # rtf_max_audio_s: a request of less audio than the first-audio wait under load is slower than real
    # time whatever the engine's speed (with random weights a few end after a few frames)
    # before_first_audio_pct: the share of the requests' time their clients waited for a first audio
    return {"ttfa_ms_p50": ttfa["p50"], "ttfa_ms_p95": ttfa["p95"], "rtf_p50": rtf["p50"],
            "before_first_audio_pct": 100 * sum(r["ttfa_ms"] / 1000 for r in ok) / sum(r["total_s"] for r in ok),
            "rtf_max": slowest["rtf"], "rtf_max_audio_s": slowest["audio_s"],
            "faster_than_real_time": sum(r["rtf"] < 1 for r in ok),
            "underrun_s_max": max(r["underrun_s"] for r in ok),
            "streams_with_underrun": sum(r["underrun_s"] > 0.01 for r in ok),
            **({"stages_ms": stage_summary(ok)} if all("stages_ms" in r for r in ok) else {})}


def stage_summary(ok: list[dict]) -> dict:
    """p50 and p95 of each engine stage until the first audio (the records' stages_ms, in stage order;
    a stage a request skipped counts as 0 ms for it)."""
    stages = list(dict.fromkeys(stage for r in ok for stage in r["stages_ms"]))
    return {stage: {key: value for key, value in percentiles([r["stages_ms"].get(stage, 0.0) for r in ok]).items()
                    if key in ("p50", "p95")} for stage in stages}


def project_commit(root: Path = ROOT) -> str:
    """HEAD's short hash, with "+modified" when tracked files differ from it (a benchmark machine's copy
    of a working tree can come with a stale .git: its HEAD alone would name the wrong code).
    S1_COMMIT, when set, names the commit instead."""
    if os.environ.get("S1_COMMIT"):
        return os.environ["S1_COMMIT"]

    def git(*args: str) -> str | None:
        try:
            run = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:  # no git here
            return None
        return run.stdout.strip() if run.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    changes = git("status", "--porcelain", "--untracked-files=no")
    if changes is None:  # e.g. a broken index: say so rather than call the tree clean
        return head + "+status-unknown"
    return head + ("+modified" if changes else "")


def environment() -> dict:
    import torch

    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "commit": project_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def write_reports(report: dict, json_path: Path | None, html_path: Path | None, write_html) -> None:
    """The report as JSON and, through write_html(path, report), as HTML, where paths are given."""
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
    if html_path:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        write_html(html_path, report)
