# Prepared (not run), after next-run-a.sh (which runs this at batch 64; copy its bfl-nonorm.json to ./bfl-nonorm.json, or
# set ROWS_JSON): the three forms at BATCHES (default "16 4"; then "2 32" in another call), then, in a call of its own, tests/test_gpu.py with the faster
# form (FORM=prenormed: this tree; FORM=hybrid: .hybrid/; TEST=1). One call may run 600 s.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
if [ -n "$TEST" ]; then
  tree=.; [ "$FORM" = hybrid ] && tree=.hybrid
  (cd $tree && timeout 280 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider) > $OUT/gpu-tests.txt 2>&1
  echo "gpu tests ($FORM) rc $?"; tail -1 $OUT/gpu-tests.txt; date -u; exit 0
fi
for b in ${BATCHES:-16 4}; do
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 90 python docs/benchmarks/session-s32/profile_with_rows.py ${ROWS_JSON:-bfl-nonorm.json} --weights random --frames 40 --batch $b --kv 512 > $OUT/ps-b$b-prenormed.txt 2>&1
  echo "batch $b prenormed rc $? $(grep graphed $OUT/ps-b$b-prenormed.txt)"
  (cd .hybrid && timeout 90 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512) > $OUT/ps-b$b-hybrid.txt 2>&1
  echo "batch $b hybrid rc $? $(grep graphed $OUT/ps-b$b-hybrid.txt)"
  timeout 90 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512 --fused-projections off > $OUT/ps-b$b-off.txt 2>&1
  echo "batch $b main rc $? $(grep graphed $OUT/ps-b$b-off.txt)"
done
date -u
