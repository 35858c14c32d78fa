"""scripts/test_gpu.sh: on a machine without CUDA it says so and runs nothing; --fetch-wheels fetches every wheel."""

import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_gpu_suite_says_it_needs_a_gpu_and_installs_nothing():
    run = subprocess.run(["bash", "scripts/test_gpu.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "no CUDA GPU here" in run.stderr
    assert "pytest" not in run.stdout


def test_fetching_wheels_takes_the_newest_of_a_package_not_installed_here(tmp_path):
    # A python3 whose pip has nothing installed (`pip show` fails, as pip's does) and logs each download.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text('#!/usr/bin/env bash\n'
                                  'if [ "$3" = show ]; then exit 1; fi\n'
                                  f'echo "${{@: -1}}" >> {tmp_path}/downloads\n')
    (shim / "python3").chmod(0o755)
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "test_gpu.sh").write_text((ROOT / "scripts" / "test_gpu.sh").read_text())
    env = {"PATH": f"{shim}:/usr/bin:/bin"}
    run = subprocess.run(["bash", "scripts/test_gpu.sh", "--fetch-wheels"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    downloads = (tmp_path / "downloads").read_text().split()
    assert "torchao" in downloads and "importlib-metadata" in downloads and not any("==" in d for d in downloads)
