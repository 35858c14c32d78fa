# Prepared for the next device session (not run): branch int8-rows. A Triton kernel for batched rows
# times int8 weights with row scales (engine/model/int8_rows.py), wired into the compiled batched step
# under --quantize int8 (Block.use_int8_rows: output, gate/up and down projections; QKV stays bf16).
# At 64 rows the step's projections are bound by their weights' bytes (docs/PERFORMANCE.md,
# 2026-11-27 06:23-07:01: matmuls ~1.7 ms of a ~4.2 ms batch-64 step); torchao's batched int8 path
# expands the weights to bf16 before cuBLAS, which is why int8 lost at 64 streams.
# Tree: rm -rf .i8 && mkdir .i8 && git archive int8-rows engine scripts assets app pytest.ini launch.py \
#   $(git ls-tree -r --name-only int8-rows tests | grep '\.py$') | tar -x -C .i8      (carry: .whl .i8)
# (Without the branch: the same files are main with docs/benchmarks/session-s38/int8-rows.diff applied.)
# .whl must hold torchao (torchao-0.18.0-py3-none-any.whl, pure Python): the device image has none.
# STEP=tests (GPU tests), STEP=bench (the kernel alone against cuBLAS), then STEP=step (the step and in process).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
cd .i8
if [ "${STEP:-tests}" = tests ]; then
  S1_FIXTURES_DIR=$OLDPWD/tests/fixtures timeout 500 python -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_int8_rows.py tests/test_fused_linear.py 2>&1 | tail -4
elif [ "$STEP" = bench ]; then
  timeout 500 python scripts/bench_int8_rows.py --rows 64 --json $OUT/int8-rows-64.json 2>&1 | grep -v Warn
else
  for run in "none on" "int8 on" "int8 off"; do
    set -- $run
    timeout 150 python scripts/profile_step.py --weights random --frames 20 --batch 64 --kv 1024 --quantize $1 \
      --int8-rows $2 --json $OUT/ps64-$1-$2.json > $OUT/ps64-$1-$2.txt 2>&1
    echo "quantize $1 int8-rows $2: $(grep -E 'graphed|row 0' $OUT/ps64-$1-$2.txt | tr '\n' ' ')"
  done
  for q in int8 none; do
    echo "in process, quantize=$q"
    timeout 120 python scripts/load_test.py --in-process --weights random --engine-option quantize=$q \
      --levels 64,64,64 --requests-per-client 1 --distinct-clips 21 --json $OUT/bursts-$q.json 2>&1 | grep "streams:"
  done
fi
date -u
