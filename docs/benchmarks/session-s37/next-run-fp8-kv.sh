# Prepared for the next device session (not run): the fp8 KV cache (branch fp8-kv; on main as
# docs/benchmarks/session-s37/fp8-kv-cache.diff). At 64 rows the slow attention is ~1.6 of a 3.86 ms
# step, reading keys and values at ~2.2 TB/s (docs/PERFORMANCE.md, 2026-11-26): e4m3 halves those bytes.
# Tree: rm -rf .fp8 && mkdir .fp8 && git archive fp8-kv engine scripts assets app pytest.ini launch.py \
#   $(git ls-tree -r --name-only fp8-kv tests | grep '\.py$') | tar -x -C .fp8     (carry: .whl .fp8)
# STEP=tests first (GPU tests: the kernel's fp8 tests, the engine on an fp8 cache, then the decode
# kernel's and the compiled step's existing tests, which the kernel change touches), then STEP=speed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
cd .fp8
if [ "${STEP:-tests}" = tests ]; then
  S1_FIXTURES_DIR=$OLDPWD/tests/fixtures timeout 540 python -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_kv_cache_dtype.py tests/test_decode_attention.py tests/test_batched_step.py \
    "tests/test_gpu.py::test_compiled_graphed_step_matches_eager_step" \
    "tests/test_gpu.py::test_a_sequence_gets_the_same_codes_alone_or_in_a_full_graphed_batch" 2>&1 | tail -15
else
  for kv in auto fp8 auto fp8; do
    timeout 120 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512 --kv-cache $kv \
      > $OUT/ps-$kv.txt 2>&1; echo "batch 64 kv_cache=$kv: $(grep graphed $OUT/ps-$kv.txt)"
  done
  # The drift (full-size random weights give a number, not a verdict: run it on the real checkpoint too)
  timeout 120 python scripts/kv_cache_error.py --weights random --device cuda --json $OUT/drift.json 2>&1 | tail -9
  for kv in auto fp8; do
    echo "in process, kv_cache=$kv"
    timeout 110 python scripts/load_test.py --in-process --weights random --engine-option kv_cache=$kv \
      --levels 64,64,64 --requests-per-client 1 --distinct-clips 21 --json $OUT/bursts-$kv.json 2>&1 | grep "streams:"
  done
fi
date -u
