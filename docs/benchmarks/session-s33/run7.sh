# Run 7 (session 33): the split merge loading 8 splits at once (main's tree: vectorised _merge_splits), and the
# same merge folded into the attention's last program (.fold/: fold-merge-fixed.diff + the vectorised merge),
# against main (.base/). Attention GPU tests in both new trees, batch-1 frames alternating, then batch 64.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1  # the trees differ in their kernels' source, which keys the caches
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for tree in . .fold; do
  (cd $tree && timeout 110 python -m pytest -m gpu tests/test_decode_attention.py -q -p no:cacheprovider) > $OUT/tests-${tree#.}.txt 2>&1
  echo "attention tests $tree rc $? $(tail -1 $OUT/tests-${tree#.}.txt)"
done
for tree in . .base .fold . .base .fold; do
  (cd $tree && timeout 70 python scripts/profile_step.py --weights random --frames 40) > /tmp/ps.txt 2>&1
  echo "batch 1 $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend_split|_merge_splits' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
done
for tree in . .base; do
  (cd $tree && timeout 70 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512) > /tmp/ps.txt 2>&1
  echo "batch 64 $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend_split|_merge_splits' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
done
date -u
