# Run 3 (session 32): _fused_rows rewritten as a Triton-pipelined loop (num_stages), PDL wait first; GPU tests, sweep at 64 rows, the batch-64 step on/off
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 120 python -m pytest -m gpu tests/test_fused_linear.py -q -p no:cacheprovider -x > $OUT/gpu-fused.txt 2>&1; echo "fused tests rc $?"; tail -2 $OUT/gpu-fused.txt
timeout 260 python scripts/bench_fused_linear.py --rows 64 --json $OUT/bfl-rows64.json > $OUT/bfl-rows64.txt 2>&1; echo "bench rc $?"; grep -v -i warn $OUT/bfl-rows64.txt | tail -7
for fp in on off; do
  timeout 110 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512 --fused-projections $fp --json $OUT/ps-b64-$fp.json > $OUT/ps-b64-$fp.log 2>&1
  echo "batch 64 fused $fp rc $? $(grep graphed $OUT/ps-b64-$fp.log)"
done
date -u
