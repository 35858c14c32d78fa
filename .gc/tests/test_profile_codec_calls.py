"""scripts/profile_codec_calls.py: its cost fit, and a clear refusal without a CUDA GPU."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import profile_codec_calls  # noqa: E402


def test_the_fit_recovers_a_fixed_cost_and_a_cost_per_row():
    points = [(rows, 2.4 + 1.3 * rows) for rows in (1, 2, 4, 8, 16)]
    fixed, per_row = profile_codec_calls.fit_fixed_and_per_row(points)
    assert fixed == pytest.approx(2.4) and per_row == pytest.approx(1.3)
    assert profile_codec_calls.fit_fixed_and_per_row([(4, 3.0), (4, 5.0)]) == (4.0, 0.0)  # one bucket


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_script_says_it_needs_a_gpu():
    run = subprocess.run([sys.executable, "scripts/profile_codec_calls.py", "--weights", "random"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr
