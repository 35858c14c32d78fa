# Prepared for the next device run (not run): _fused_rows for all four projections of the batched steps, the norms as Inductor kernels before it
# (fused-rows-prenormed.diff), against fused-rows-hybrid.diff (output and down only) and main (--fused-projections off).
# Before: .hybrid/ = git archive <main> engine scripts assets tests pytest.ini (pytest.ini makes .hybrid the tests' root), with
# fused-rows-hybrid.diff applied to it (cd .hybrid && patch -p1 < ../docs/benchmarks/session-s32/fused-rows-hybrid.diff: git apply inside
# a repository skips paths outside its folder);
# then git apply docs/benchmarks/session-s32/fused-rows-prenormed.diff here; .whl/ = the wheels the device lacks (tree < 64 MiB).
# .hybrid/ and .whl/ listed in .git/info/exclude and named in the run's carry.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 100 python -m pytest -m gpu tests/test_fused_linear.py -q -p no:cacheprovider > $OUT/gpu-fused.txt 2>&1; echo "fused tests rc $?"; tail -1 $OUT/gpu-fused.txt
timeout 240 python scripts/bench_fused_linear.py --rows 64 --no-norm --json $OUT/bfl-nonorm.json > $OUT/bfl-nonorm.txt 2>&1; echo "bench rc $?"; grep -v -i warn $OUT/bfl-nonorm.txt | tail -6
BATCHES=64 ROWS_JSON=$OUT/bfl-nonorm.json bash docs/benchmarks/session-s32/next-run-b.sh  # the three forms at batch 64; ~450 s in all
