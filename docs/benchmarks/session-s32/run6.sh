# Run 6 (session 32): _fused_rows (no PDL) for the batched steps' output and down projections only (qkv and gate/up stay cuBLAS after Inductor's norm); the batch-64 step against --fused-projections off; GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for fp in on off on off; do
  timeout 80 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512 --fused-projections $fp --json $OUT/ps-b64-$fp.json > $OUT/ps-b64-$fp.txt 2>&1
  echo "batch 64 fused $fp rc $? $(grep graphed $OUT/ps-b64-$fp.txt)"
done
timeout 100 python -m pytest -m gpu tests/test_fused_linear.py -q -p no:cacheprovider > $OUT/gpu-tests.txt 2>&1; echo "fused tests rc $?"; tail -1 $OUT/gpu-tests.txt
timeout 240 python -m pytest -m gpu tests/test_gpu.py tests/test_batched_step.py -q -p no:cacheprovider >> $OUT/gpu-tests.txt 2>&1; echo "gpu tests rc $?"; tail -1 $OUT/gpu-tests.txt
date -u
