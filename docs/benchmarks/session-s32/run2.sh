# Run 2 (session 32): _fused_rows (working tree): its GPU tests, a launch sweep at 64 rows, the batch-64 and batch-16 steps with it and without (--fused-projections off: cuBLAS and Inductor)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 150 python -m pytest -m gpu tests/test_fused_linear.py -q -p no:cacheprovider -x > $OUT/gpu-fused.txt 2>&1; echo "fused tests rc $?"; tail -3 $OUT/gpu-fused.txt
timeout 200 python scripts/bench_fused_linear.py --rows 64 --json $OUT/bfl-rows64.json > $OUT/bfl-rows64.txt 2>&1; echo "bench rc $?"; cat $OUT/bfl-rows64.txt | grep -v -i warn | tail -8
for b in 64 16; do for fp in on off; do
  timeout 120 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512 --fused-projections $fp --json $OUT/ps-b$b-$fp.json > $OUT/ps-b$b-$fp.txt 2>&1
  echo "batch $b fused $fp rc $? $(grep graphed $OUT/ps-b$b-$fp.txt)"
done; done
date -u
