# Run 8 (session 33): the one-row merge loading 8 splits at once, batches one at a time (main's tree) against
# main (.base/): attention GPU tests, batch-1 frames and batch-64 steps alternating, then tests/test_gpu.py.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1  # the trees differ in their kernels' source, which keys the caches
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 80 python -m pytest -m gpu tests/test_decode_attention.py -q -p no:cacheprovider > $OUT/tests-attention.txt 2>&1
echo "attention tests rc $? $(tail -1 $OUT/tests-attention.txt)"
for tree in . .base . .base; do
  (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40) > /tmp/ps.txt 2>&1
  echo "batch 1 $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E "${KERNEL:-_merge_splits}" /tmp/ps.txt | tr -s ' ')"
done
for tree in . .base; do
  (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512) > /tmp/ps.txt 2>&1
  echo "batch 64 $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E "${KERNEL:-_merge_splits}" /tmp/ps.txt | tr -s ' ')"
done
timeout 250 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider > $OUT/tests-gpu.txt 2>&1
echo "test_gpu rc $? $(tail -1 $OUT/tests-gpu.txt)"
date -u
