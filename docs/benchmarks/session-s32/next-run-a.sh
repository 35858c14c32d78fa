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
for b in 64; do  # ~450 s in all; batches 16, 4, 2 and 32 in next-run-b.sh
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 90 python docs/benchmarks/session-s32/profile_with_rows.py $OUT/bfl-nonorm.json --weights random --frames 40 --batch $b --kv 512 > $OUT/ps-b$b-prenormed.txt 2>&1
  echo "batch $b prenormed rc $? $(grep graphed $OUT/ps-b$b-prenormed.txt)"
  (cd .hybrid && timeout 90 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512) > $OUT/ps-b$b-hybrid.txt 2>&1
  echo "batch $b hybrid rc $? $(grep graphed $OUT/ps-b$b-hybrid.txt)"
  timeout 90 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512 --fused-projections off > $OUT/ps-b$b-off.txt 2>&1
  echo "batch $b main rc $? $(grep graphed $OUT/ps-b$b-off.txt)"
done
date -u
