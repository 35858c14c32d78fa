# Prepared (not run), after next-run-a.sh: batches 2, 4 and 32 for the faster of the two forms, against main; then tests/test_gpu.py with it.
# FORM=prenormed (this tree, TUNED_ROWS from next-run-a's bfl-nonorm.json, copied to ./bfl-nonorm.json) or FORM=hybrid (.hybrid/).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for b in 2 4 32; do
  if [ "$FORM" = prenormed ]; then
    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 90 python docs/benchmarks/session-s32/profile_with_rows.py bfl-nonorm.json --weights random --frames 40 --batch $b --kv 512 > $OUT/ps-b$b-new.txt 2>&1
  else
    (cd .hybrid && timeout 90 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512) > $OUT/ps-b$b-new.txt 2>&1
  fi
  echo "batch $b $FORM rc $? $(grep graphed $OUT/ps-b$b-new.txt)"
  timeout 90 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512 --fused-projections off > $OUT/ps-b$b-off.txt 2>&1
  echo "batch $b main rc $? $(grep graphed $OUT/ps-b$b-off.txt)"
done
tree=.; [ "$FORM" = hybrid ] && tree=.hybrid
(cd $tree && timeout 240 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider) > $OUT/gpu-tests.txt 2>&1; echo "gpu tests rc $?"; tail -1 $OUT/gpu-tests.txt
date -u
