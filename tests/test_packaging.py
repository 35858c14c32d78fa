"""pyproject.toml is the source of truth: the requirements files repeat its lists, the wheel carries
every module and asset, and an installed copy starts with its console scripts, away from the
checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from tests.test_app_support import ROOT, assert_audio, free_port

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (requirements-dev.txt)
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement_lines(path: Path) -> set[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {str(Requirement(line)) for line in lines if line and not line.startswith("-r")}


def normalized(requirements) -> set[str]:
    return {str(Requirement(r)) for r in requirements}


def test_requirements_txt_is_pyprojects_dependency_list():
    assert requirement_lines(ROOT / "requirements.txt") == normalized(PYPROJECT["project"]["dependencies"])


def test_requirements_dev_txt_is_the_dev_extra():
    extras = PYPROJECT["project"]["optional-dependencies"]
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev and "-r requirements-ray.txt" in dev
    listed = requirement_lines(ROOT / "requirements-dev.txt") | requirement_lines(ROOT / "requirements-ray.txt")
    assert listed == normalized(extras["dev"])


def test_requirements_ray_txt_is_the_ray_extra():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert requirement_lines(ROOT / "requirements-ray.txt") == normalized(extras["ray"])


def test_every_torch_requirement_states_the_tested_range():
    for path in ("requirements.txt", "pyproject.toml"):
        assert "tested with 2.11 (GPU), 2.13 (pinned in CI) and 2.15" in (ROOT / path).read_text(), path


def test_console_scripts_point_at_callables():
    import importlib

    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == {"s1-mini-studio", "s1-mini-engine"}
    for target in scripts.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (found,) = out.glob("s1_mini_studio-*.whl")
    return found


def test_the_wheel_carries_every_module_and_asset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "app", "engine", "assets"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    wanted = {path for path in tracked if path.endswith(".py") or path.startswith("assets/")}
    assert wanted and wanted <= names, sorted(wanted - names)
    assert not any(name.startswith(("tests/", "scripts/")) for name in names)


@pytest.mark.slow
def test_installed_package_serves_the_demo_from_outside_the_checkout(wheel, tmp_path):
    """`pip install` into a new venv (dependencies from this Python's site-packages: no download),
    then the console scripts, run from a folder that is not the checkout: the installed modules and
    assets serve /ready and a WAV, and the engine's command writes one."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-build-isolation", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "S1_MINI_CACHE_DIR": str(tmp_path / "cache"),
           "S1_MINI_VOICES_DIR": str(tmp_path / "voices"), "PYTHONPATH": ""}

    out = away / "hello.wav"
    synth = subprocess.run([str(bin_dir / "s1-mini-engine"), "synth", "--demo", "--text", "Installed.",
                            "--max-new-tokens", "16", "--seed", "1", "--out", str(out)],
                           cwd=away, env=env, capture_output=True, text=True, timeout=300)
    assert synth.returncode == 0, synth.stderr[-3000:]
    assert_audio(out.read_bytes())

    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen([str(bin_dir / "s1-mini-studio"), "--demo", "--no-ui", "--listen", f"127.0.0.1:{port}"],
                              cwd=away, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        ready = None
        for _ in range(240):
            if server.poll() is not None:
                break
            try:
                ready = httpx.get(url + "/ready", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            server_wait(server)
        assert ready is not None and ready.status_code == 200, (tmp_path / "server.log").read_text()[-3000:]
        r = httpx.post(url + "/v1/tts", json={"text": "From the installed package.", "max_new_tokens": 16}, timeout=120)
        assert r.status_code == 200 and r.headers["content-type"].startswith("audio/wav")
        assert_audio(r.content)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    text = (tmp_path / "server.log").read_text()
    # The installed copy ran, not the checkout's modules.
    assert str(ROOT / "app") not in text and "Traceback" not in text


def server_wait(process: subprocess.Popen, seconds: float = 0.5) -> None:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass
