"""scripts/test_gpu.sh: on a machine without CUDA it says so and runs nothing."""

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
