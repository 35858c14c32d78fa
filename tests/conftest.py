"""Shared test fixtures.

Golden data comes from `S1_FIXTURES_DIR` when set (any fixture set of the same layout), else from
the project's own copy in tests/fixtures.
"""

import os
import tempfile
from pathlib import Path

import pytest
import torch

from engine.compile_helpers import CompileHelpers

PROJECT_FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _no_compile_helpers(monkeypatch):
    """Tests start many engines side by side, whose compile helpers would only add CPU load; a
    start with helpers runs in processes of its own (tests/test_compilation.py)."""
    monkeypatch.setattr(CompileHelpers, "start", classmethod(lambda cls, config, device: cls()))


@pytest.fixture
def log_lines():
    """The messages the engine logs (loguru, every level from DEBUG) during the test."""
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(message.record["message"]), level="DEBUG")
    yield lines
    logger.remove(sink)


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


def pytest_configure(config):
    """On a CUDA machine every engine, runner and subprocess of the run shares one Inductor and
    Triton cache: tests that compile the same graphs (a model of the same shapes, dtype and policy)
    load what the first one compiled instead of compiling it again, and a second run on the same
    machine starts warm. S1_TEST_COMPILE_CACHE names the folder (default: under .pytest_cache);
    a test that needs cold caches sets its own (test_compilation's warm-start test)."""
    if not torch.cuda.is_available():
        return
    from engine.compilation import configure_caches

    cache = getattr(config, "cache", None)  # pytest's cache folder, unless its plugin is off
    root = os.environ.get("S1_TEST_COMPILE_CACHE") or (cache.mkdir("compile-cache") if cache else None)
    configure_caches(Path(root or tempfile.mkdtemp(prefix="s1-test-compile-")))


@pytest.fixture(scope="session")
def full_size_cuda_model():
    """The full-size S1-mini transformer with random weights, bf16, on the GPU (fused as the engine
    loads it), made once for every test that reads it; a test that changes it works on a copy."""
    from engine.checkpoints import DEMO_DIR
    from engine.loader import FULL_SIZE_CONFIG, token_layout
    from engine.model.codec_config import CodecConfig
    from engine.model.dual_ar import DualARConfig
    from engine.model.loading import random_dual_ar
    from engine.text.tokenizer import S1Tokenizer

    layout = token_layout(S1Tokenizer.from_dir(DEMO_DIR), CodecConfig.s1_mini())
    return random_dual_ar(DualARConfig.from_json(FULL_SIZE_CONFIG), layout, "cuda", torch.bfloat16).fuse_()


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
