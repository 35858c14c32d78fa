"""Shared test fixtures.

Golden data comes from `S1_FIXTURES_DIR` when set (any fixture set of the same layout), else from
the project's own copy in tests/fixtures.
"""

import os
from pathlib import Path

import pytest
import torch

PROJECT_FIXTURES = Path(__file__).parent / "fixtures"


def fixtures_root() -> Path:
    return Path(os.environ.get("S1_FIXTURES_DIR") or PROJECT_FIXTURES)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return fixtures_root()


@pytest.fixture(scope="session")
def s1_dir(fixtures_dir) -> Path:
    return fixtures_dir / "s1-tiny"


@pytest.fixture(scope="session")
def codec_dir(fixtures_dir) -> Path:
    return fixtures_dir / "codec-tiny"


@pytest.fixture(scope="session")
def s1_expected(s1_dir) -> dict:
    return torch.load(s1_dir / "expected.pt", weights_only=True)


@pytest.fixture(scope="session")
def codec_expected(codec_dir) -> dict:
    return torch.load(codec_dir / "expected.pt", weights_only=True)


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where CUDA is absent."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_dynamo_for_gpu_tests(request):
    """Each GPU test compiles its own models, and Dynamo keeps compiled code per function across
    tests: after 32 recompiles of one (the step runner's regions, compiled by test after test in one
    pytest process) it refuses the next under fullgraph=True. An engine compiles each region a few
    times; tests start from none, as a fresh process does."""
    if request.node.get_closest_marker("gpu") is not None:
        torch._dynamo.reset()
    yield
