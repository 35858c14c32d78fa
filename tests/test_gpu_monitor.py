"""scripts/gpu_monitor.py: nvidia-smi's samples read, summed up per GPU, and taken while a level runs."""

import os
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import gpu_monitor  # noqa: E402
import load_test  # noqa: E402

needs_sh = pytest.mark.skipif(sys.platform == "win32", reason="the fake nvidia-smi is a shell script")


def test_a_sample_line_gives_its_numbers_and_not_available_values_as_none():
    assert gpu_monitor.parse_sample("0, 1755, 1980, 61, 650.25\n") == {
        "index": 0.0, "clocks.sm": 1755.0, "clocks.max.sm": 1980.0, "temperature.gpu": 61.0, "power.draw": 650.25}
    sample = gpu_monitor.parse_sample("1, 1980, 1980, 40, [N/A]")
    assert sample["power.draw"] is None and sample["index"] == 1.0


@pytest.mark.parametrize("line", ["", "No devices were found", "index, clocks.sm, clocks.max.sm, temperature.gpu, power.draw",
                                  "0, 1755, 1980, 61", "[N/A], 1755, 1980, 61, 650"])
def test_lines_that_are_not_samples_are_skipped(line):
    assert gpu_monitor.parse_sample(line) is None


def test_the_summary_gives_each_gpu_its_lowest_and_median_clock_and_its_highest_heat_and_power():
    lines = ["0, 1980, 1980, 50, 500", "1, 1410, 1980, 70, 690", "0, 1755, 1980, 66, 700",
             "0, 1830, 1980, 61, [N/A]", "1, [N/A], 1980, [N/A], [N/A]"]
    gpus = gpu_monitor.summarize([gpu_monitor.parse_sample(line) for line in lines])
    assert gpus == [
        {"index": 0, "samples": 3, "sm_clock_mhz_min": 1755.0, "sm_clock_mhz_p50": 1830.0,
         "sm_clock_mhz_allowed": 1980.0, "temperature_c_max": 66.0, "power_w_max": 700.0},
        {"index": 1, "samples": 2, "sm_clock_mhz_min": 1410.0, "sm_clock_mhz_p50": 1410.0,
         "sm_clock_mhz_allowed": 1980.0, "temperature_c_max": 70.0, "power_w_max": 690.0}]
    assert gpu_monitor.describe(gpus[0]) == (
        "GPU 0: SM clock 1830 MHz p50, lowest 1755 MHz (at most 1980 MHz); up to 66 C, 700 W (3 samples)")
    unknown = {**gpus[1], "power_w_max": None}
    assert "n/a (2 samples)" in gpu_monitor.describe(unknown)


def nvidia_smi_script(folder: Path, body: str) -> Path:
    """An executable nvidia-smi in `folder` running the shell commands `body`; returns the folder."""
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def fake_nvidia_smi(folder: Path) -> Path:
    """An nvidia-smi that writes its arguments to args.txt and prints two samples every 20 ms."""
    return nvidia_smi_script(folder, 'echo "$@" > "$(dirname "$0")/args.txt"\n'
                             'while true; do echo "0, 1755, 1980, 61, 650"; echo "0, 1980, 1980, 58, 600"; sleep 0.02; done\n')


@needs_sh
def test_the_monitor_samples_in_nvidia_smi_s_loop_mode_until_the_block_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path)) + os.pathsep + os.environ["PATH"])
    with gpu_monitor.GPUMonitor() as monitor:
        time.sleep(0.3)
    assert monitor._process.poll() is not None  # stopped with the block
    (gpu,) = monitor.summary()
    assert gpu["samples"] >= 2 and gpu["sm_clock_mhz_min"] == 1755.0 and gpu["sm_clock_mhz_allowed"] == 1980.0
    assert monitor.problem is None
    assert (tmp_path / "args.txt").read_text().split() == [
        "--query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw", "--format=csv,noheader,nounits",
        "--loop-ms=500"]


@needs_sh
def test_nothing_is_sampled_when_disabled_or_without_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path)))
    with gpu_monitor.GPUMonitor(enabled=False) as monitor:
        time.sleep(0.1)
    assert monitor.summary() is None and not (tmp_path / "args.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with gpu_monitor.GPUMonitor() as monitor:
        pass
    assert monitor.summary() is None


@needs_sh
def test_what_nvidia_smi_printed_instead_of_samples_is_kept(tmp_path, monkeypatch):
    folder = nvidia_smi_script(tmp_path, 'echo \'Field "clocks.max.sm" is not a valid field to query.\' >&2\nexit 2\n')
    monkeypatch.setenv("PATH", str(folder) + os.pathsep + os.environ["PATH"])
    with gpu_monitor.GPUMonitor() as monitor:
        time.sleep(0.2)
    assert monitor.summary() is None
    assert monitor.problem == 'Field "clocks.max.sm" is not a valid field to query.'


@pytest.mark.parametrize("url, here", [("http://127.0.0.1:7860", True), ("http://localhost:7860", True),
                                       ("http://[::1]:7860", True), ("http://10.0.0.5:7860", False),
                                       ("https://abc-7860.proxy.runpod.net", False)])
def test_the_load_test_samples_this_machine_s_gpus_only_for_an_engine_on_it(url, here):
    assert load_test.engine_gpus_are_here(SimpleNamespace(in_process=False, url=url)) is here
    assert load_test.engine_gpus_are_here(SimpleNamespace(in_process=True, url=url)) is True
