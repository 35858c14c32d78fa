"""Compile helpers (engine/compile_helpers.py): when they start, how the engine waits for them, what
it does when one fails or hangs, and how their packages reach the engine's regions. A first start
with helpers on the GPU: tests/test_compilation.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine import compile_helper_process, compile_helpers, compiled_regions
from engine.compile_helpers import PARTS, CompileHelpers, spawn
from engine.config import EngineConfig
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def python(code: str):
    return spawn([sys.executable, "-c", code])  # spawn as imported: a test patching the module's keeps it


def test_no_helper_means_no_wait():
    helpers = CompileHelpers()
    assert not helpers.running()
    helpers.wait("codec")
    helpers.close()


def test_wait_waits_for_the_helper_and_reports_it_once(log_lines):
    process, log = python("import time; time.sleep(0.5)")
    helpers = CompileHelpers({"codec": (process, log)})
    assert helpers.running()
    helpers.wait("codec")
    assert process.poll() == 0 and not helpers.running()
    helpers.wait("codec")  # answered at once from now on
    assert sum("graphs ended" in line for line in log_lines) == 1


def test_the_report_tells_when_the_helper_ended_and_when_the_engine_went_on(log_lines):
    """A helper that ended while the engine still compiled its own graphs: both times, apart."""
    process, log = python("pass")
    helpers = CompileHelpers({"prefill": (process, log)})
    process.wait(60)
    wait_until(lambda: "prefill" in helpers._ended, "the helper's end noted", 10)
    time.sleep(1.5)  # the engine goes on well after the helper ended, however slowly the helper started
    helpers.wait("prefill")
    [line] = [line for line in log_lines if "graphs ended" in line]
    ended, went_on = map(float, re.findall(r"(\d+\.\d) s", line))
    assert ended + 1.2 <= went_on, line


def test_a_failed_helper_is_a_warning_with_its_output(log_lines):
    helpers = CompileHelpers({"prefill": python("import sys; print('out of memory here'); sys.exit(3)")})
    helpers.wait("prefill")
    warning = next(line for line in log_lines if "failed" in line)
    assert "exit 3" in warning and "out of memory here" in warning and "compiles them itself" in warning


def test_a_helper_past_the_deadline_is_stopped(monkeypatch, log_lines):
    monkeypatch.setattr(compile_helpers, "WAIT_S", 0.3)
    process, log = python("import time; time.sleep(60)")
    helpers = CompileHelpers({"codec": (process, log)})
    helpers.wait("codec")
    assert process.poll() is not None  # killed, not left behind
    assert any("ran past" in line for line in log_lines)


def test_close_stops_helpers_still_running():
    process, log = python("import time; time.sleep(60)")
    helpers = CompileHelpers({"prefill": (process, log)})
    helpers.close()
    assert process.poll() is not None and not helpers.running()


def test_reasons_against_helpers(monkeypatch):
    device = torch.device("cuda")
    parts = list(PARTS)
    assert "turned off" in compile_helpers._reason_against(EngineConfig(compile_helpers=False), device, parts)
    assert "every part" in compile_helpers._reason_against(EngineConfig(), device, [])
    monkeypatch.setattr(compile_helpers, "usable_cpus", lambda: 2)
    assert "2 CPUs" in compile_helpers._reason_against(EngineConfig(), device, parts)
    monkeypatch.setattr(compile_helpers, "usable_cpus", lambda: 16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (12 << 30, 80 << 30))
    assert "GPU memory free" in compile_helpers._reason_against(EngineConfig(), device, parts)
    assert compile_helpers._reason_against(EngineConfig(), device, parts[:1]) is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (40 << 30, 80 << 30))
    assert compile_helpers._reason_against(EngineConfig(), device, parts) is None


def test_a_helper_starts_for_each_part_the_store_lacks(monkeypatch):
    """Only parts with a region that installed nothing get a helper, a two-slot engine of the same
    configuration that starts no helpers of its own."""
    monkeypatch.undo()  # the conftest's stand-in for CompileHelpers.start
    installed = {fn: True for functions in PARTS.values() for fn in functions}
    installed[PARTS["codec"][1]] = False
    monkeypatch.setattr(compiled_regions, "installed", lambda fn: installed[fn])
    monkeypatch.setattr(compile_helpers, "usable_cpus", lambda: 16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (40 << 30, 80 << 30))
    commands = []
    monkeypatch.setattr(compile_helpers, "spawn", lambda command: commands.append(command) or python("pass"))
    config = EngineConfig(random_weights=True, max_batch_size=64, cache_dir="/tmp/x")
    helpers = CompileHelpers.start(config, torch.device("cuda"))
    assert helpers.running()
    [command] = commands
    assert command[2:4] == ["engine.compile_helper_process", "codec"]
    helper_config = compile_helpers.config_from_json(command[4])
    assert (helper_config.max_batch_size, helper_config.compile_helpers) == (compile_helpers.HELPER_SLOTS, False)
    assert (helper_config.random_weights, helper_config.cache_dir) == (True, "/tmp/x")
    helpers.close()


def test_a_helper_runs_this_package_with_the_hub_offline(monkeypatch):
    """The engine fetched the checkpoint before it started the helpers: a helper finds it in the
    hub's cache without asking the network."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    process, log = python("import os, engine.compile_helpers; print(os.environ['HF_HUB_OFFLINE'])")
    assert process.wait(timeout=120) == 0
    log.seek(0)
    assert log.read().decode().split() == ["1"]
    log.close()


def test_helpers_that_cannot_start_leave_the_engine_to_compile(monkeypatch, log_lines):
    monkeypatch.undo()  # the conftest's stand-in for CompileHelpers.start
    monkeypatch.setattr(compiled_regions, "installed", lambda fn: False)
    monkeypatch.setattr(compile_helpers, "usable_cpus", lambda: 16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (40 << 30, 80 << 30))
    started = []

    def spawn_one_then_fail(command):
        if started:
            raise OSError("no more processes")
        started.append(python("import time; time.sleep(60)"))
        return started[0]

    monkeypatch.setattr(compile_helpers, "spawn", spawn_one_then_fail)
    helpers = CompileHelpers.start(EngineConfig(random_weights=True), torch.device("cuda"))
    assert not helpers.running() and started[0][0].poll() is not None  # the one started is stopped
    assert any("could not start" in line and "no more processes" in line for line in log_lines)


def test_a_helper_refuses_an_unknown_part():
    with pytest.raises(ValueError, match="unknown part"):
        compile_helper_process.run_part("decoder", EngineConfig(demo=True))


def test_the_config_travels_whole():
    config = EngineConfig(random_weights=True, max_encode_batch=8, cache_dir="/tmp/x", seed=3)
    assert compile_helpers.config_from_json(compile_helpers.config_to_json(config)) == config


# A process with compiled pointwise regions stored under argv[2]: argv[3] "helper" compiles two of
# them but stores only biased_residual's (compile_helpers.store_only); "engine" makes its regions
# while the store is empty, compiles biased_snake, runs the helper (argv[4]: its command line) and
# then calls biased_residual, whose package the helper saved meanwhile. Prints the graphs it traced.
POINTWISE_REGIONS = """
import json, subprocess, sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from torch._dynamo.utils import counters
from engine import compiled_regions
from engine.compilation import CompilePolicy
from engine.model.codec_convs import biased_residual, biased_snake
from engine.model.codec_streamers import compiled_pointwise
compiled_regions.use_store(Path(sys.argv[2]))
if sys.argv[3] == "helper":
    compiled_regions.store_only([biased_residual], name_offset=10**9)
ops = compiled_pointwise(CompilePolicy(True, False, "test", pdl=False).inductor_backend())
gen = torch.Generator().manual_seed(0)
x, y = (torch.randn(3, 8, 5, generator=gen) for _ in range(2))
bias, alpha = torch.randn(8, generator=gen), torch.rand(1, 8, 1, generator=gen) + 0.5

with torch.inference_mode():
    snaked = ops.biased_snake(x, bias, alpha, 1e-9)
    torch.testing.assert_close(snaked, biased_snake(x, bias, alpha, 1e-9))
    if sys.argv[3] == "engine":
        subprocess.run(json.loads(sys.argv[4]), check=True)
    traced = counters["stats"]["unique_graphs"]
    torch.testing.assert_close(ops.biased_residual(x, y, bias), biased_residual(x, y, bias), rtol=0, atol=0)
    # the installed package's globals left this process's own graph alone
    torch.testing.assert_close(ops.biased_snake(x, bias, alpha, 1e-9), snaked, rtol=0, atol=0)
print(json.dumps({"traced_before": traced, "traced": counters["stats"]["unique_graphs"],
                  "residual_installed": compiled_regions.installed(biased_residual)}))
"""


def test_a_helpers_package_reaches_a_region_made_before_it_was_saved(tmp_path):
    """The engine makes its regions at load, before any helper saved: a region that found no
    package then installs one saved since at its first call, and traces nothing. The helper saves
    its own regions' packages only (the engine saves the others')."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    store = tmp_path / "regions"

    def command(role: str, *rest: str) -> list[str]:
        return [sys.executable, "-c", POINTWISE_REGIONS, str(ROOT), str(store), role, *rest]

    def run(role: str, *rest: str) -> dict:
        done = subprocess.run(command(role, *rest), capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stored() -> set[str]:
        return {entry.parent.name.split("-")[0] for entry in store.glob("*/entry")}

    assert run("helper")["traced"] == 2
    assert stored() == {"engine.model.codec_convs.biased_residual"}
    shutil.rmtree(store)
    engine = run("engine", json.dumps(command("helper")))
    assert engine["residual_installed"] is True
    assert engine["traced"] == engine["traced_before"] == 1  # the snake's graph, none for the residual
    assert stored() == {"engine.model.codec_convs.biased_residual", "engine.model.codec_convs.biased_snake"}
