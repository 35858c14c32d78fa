#!/usr/bin/env bash
# Run every GPU test (pytest -m gpu) in one go on a CUDA machine, spread over a few pytest workers
# that share the GPU and one compile cache.
#
#   bash scripts/test_gpu.sh [pytest args...]   # on the GPU machine
#   bash scripts/test_gpu.sh --fetch-wheels     # on a machine with network: wheels for a GPU machine without it
#
# A GPU machine without network (a lent device machine) installs the wheels it finds in .whl/ first:
# fetch them beforehand into .whl/ (for Python 3.12 on x86-64 Linux, PYTHON_VERSION to change it)
# and carry that folder along. Elsewhere the requirements are installed with pip as usual.
# GPU_TEST_WORKERS (default 4) sets the workers; each test file runs in one worker, so the tests of a
# file share their compiled engines and graphs. S1_TEST_COMPILE_CACHE keeps the compile cache
# elsewhere than .pytest_cache/compile-cache (a second run on the same machine starts warm).
set -euo pipefail
cd "$(dirname "$0")/.."

# The runtime packages the GPU tests import that a CUDA image with PyTorch, Triton, pytest and
# pytest-xdist usually lacks (no gradio: the UI has no GPU tests).
WHEELS="torchao soundfile cffi pycparser soxr pydub platformdirs loguru fastapi starlette pydantic pydantic-core
annotated-types typing-inspection annotated-doc uvicorn httptools python-multipart ormsgpack pybase64 fastapi-offline
opentelemetry-api importlib-metadata"

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p .whl
  for name in $WHEELS; do
    # The version installed here where there is one (the CPU suite runs with it), so that the
    # packages match one another (pydantic and pydantic-core pin each other); else the newest
    # (pip show fails for a package not installed).
    version=$(python3 -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$name${version:+==$version}"
  done
  echo "wheels in .whl/ ($(du -sh .whl | cut -f1)); carry that folder to the GPU machine"
  exit 0
fi

python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU here: the GPU tests need one')"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/s1-site .whl/*.whl
  export PYTHONPATH=/tmp/s1-site${PYTHONPATH:+:$PYTHONPATH}
else
  python3 -m pip install -q -r requirements-dev.txt
fi

export S1_TEST_COMPILE_CACHE="${S1_TEST_COMPILE_CACHE:-$PWD/.pytest_cache/compile-cache}" PYTHONUNBUFFERED=1
# Only the files that hold GPU tests: the others need packages (Gradio, the API clients) that a GPU
# machine set up for the engine may lack, and have nothing to run here. Test paths among the
# arguments (tests/test_gpu.py, tests/test_gpu.py::test_name) run instead of all of them.
files=()
if ! printf '%s\n' "$@" | grep -q '^tests/'; then
  mapfile -t files < <(grep -rlE "pytest\.mark\.gpu" tests --include="test_*.py" | sort)
fi
exec python3 -m pytest -m gpu -n "${GPU_TEST_WORKERS:-4}" --dist loadfile --durations 20 -q -rs "${files[@]}" "$@"
