# Prepared for the next device session (not run): the int8 rows kernel of branch int8-rows, alone.
# At 64 rows a step's projections are bound by their weights' bytes (docs/PERFORMANCE.md,
# 2026-11-27 06:23-07:01: matmuls ~1.7 ms of a ~4.2 ms batch-64 step); int8 halves the bytes of all
# but the QKV projections. Measure the kernel against cuBLAS bf16 first; wire it into the batched
# step (--quantize int8) only if it reads int8 clearly faster than cuBLAS reads bf16.
# Tree: rm -rf .i8 && mkdir .i8 && git archive int8-rows engine scripts assets app pytest.ini launch.py \
#   $(git ls-tree -r --name-only int8-rows tests | grep '\.py$') | tar -x -C .i8      (carry: .whl .i8)
# (Without the branch: the same files are main with docs/benchmarks/session-s38/int8-rows.diff applied.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
cd .i8
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_int8_rows.py 2>&1 | tail -4
for rows in 64 16; do
  timeout 180 python scripts/bench_int8_rows.py --rows $rows --json $OUT/int8-rows-$rows.json 2>&1 | grep -v Warn
done
date -u
