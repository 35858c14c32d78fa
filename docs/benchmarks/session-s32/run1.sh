# Prepared for the next device run (not run): the one-row sampler (one-row-sampler.diff, checked only in Triton's interpreter on the CPU).
# Before: git apply docs/benchmarks/session-s31/one-row-sampler.diff; .base/ = git archive <main before it> engine scripts assets; .whl/ = the wheels the device lacks.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 150 python -m pytest -m gpu tests/test_sampling_kernel.py -q -p no:cacheprovider > $OUT/gpu-sampling.txt 2>&1; echo "sampling tests rc $?"; tail -1 $OUT/gpu-sampling.txt
timeout 100 python docs/benchmarks/session-s31/bench_one_row.py > $OUT/bench-one-row.txt 2>&1; echo "bench rc $?"; grep " us" $OUT/bench-one-row.txt
for tree in . .base . .base; do
  tag=$(basename $(cd $tree && pwd)); [ "$tree" = . ] && tag=new
  (cd $tree && timeout 100 python scripts/profile_step.py --weights random --frames 40 --json $OUT/ps-$tag.json) > $OUT/ps-$tag.txt 2>&1
  echo "$tag rc $? $(grep graphed $OUT/ps-$tag.txt)"
done
timeout 280 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider > $OUT/gpu-tests.txt 2>&1; echo "gpu tests rc $?"; tail -1 $OUT/gpu-tests.txt
date -u
