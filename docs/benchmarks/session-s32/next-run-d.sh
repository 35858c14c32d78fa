# Prepared for a device run (not run): the splits of the decode attention merged by their last program (fold-merge.diff),
# which removes the 28 _merge_splits kernels of a frame (59 us of kernel time at batch 1, kv 512; 66 us at batch 64).
# Before: .base/ = git archive <main> engine scripts assets; then git apply docs/benchmarks/session-s32/fold-merge.diff here;
# .whl/ = the wheels the device lacks; .base/ and .whl/ named in the run's carry.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 120 python -m pytest -m gpu tests/test_decode_attention.py -q -p no:cacheprovider > $OUT/gpu-attention.txt 2>&1; echo "attention tests rc $?"; tail -1 $OUT/gpu-attention.txt
for tree in . .base . .base; do
  tag=new; [ "$tree" = .base ] && tag=base
  (cd $tree && timeout 90 python scripts/profile_step.py --weights random --frames 40 --json $OUT/ps-b1-$tag.json) > $OUT/ps-b1-$tag.txt 2>&1
  echo "batch 1 $tag rc $? $(grep graphed $OUT/ps-b1-$tag.txt)"
done
for tree in . .base; do
  tag=new; [ "$tree" = .base ] && tag=base
  (cd $tree && timeout 90 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512) > $OUT/ps-b64-$tag.txt 2>&1
  echo "batch 64 $tag rc $? $(grep graphed $OUT/ps-b64-$tag.txt)"
done
date -u
# Then, in a second call (one call may run 600 s): timeout 280 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider
