# Run 5 (session 32): fused-rows.diff with PDL off for _fused_rows; sweep at 64 rows (no PDL), then the batch-64 step with the fastest setting per shape against cuBLAS (--fused-projections off)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 280 python scripts/bench_fused_linear.py --rows 64 --json $OUT/bfl-rows64.json > $OUT/bfl-rows64.txt 2>&1; echo "bench rc $?"; grep -v -i warn $OUT/bfl-rows64.txt | tail -7
for fp in on off; do
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 110 python docs/benchmarks/session-s32/profile_with_rows.py $OUT/bfl-rows64.json --weights random --frames 40 --batch 64 --kv 512 --fused-projections $fp > $OUT/ps-b64-$fp.txt 2>&1
  echo "batch 64 fused $fp rc $? $(grep graphed $OUT/ps-b64-$fp.txt)"
done
date -u
