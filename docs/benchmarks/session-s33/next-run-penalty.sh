# Prepared for a device run (not run): the compiled batch-1 step's repetition penalty with its history compared
# (compared-history.diff: one small reduction a codebook where the scatter is a zero fill and a scatter kernel, 18
# kernels a frame by the last profile: triton_poi_fused__to_copy_scatter_add_zeros_like_{0,1}, 19.5 us).
# Before: .base/ = git archive <main> engine scripts assets app; then patch -p1 < docs/benchmarks/session-s33/compared-history.diff
# here; .whl/ = the wheels the device lacks; .base/ and .whl/ named in the run's carry.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1  # the trees differ in sampling.py, which keys the caches
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for tree in . .base . .base; do
  (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40) > /tmp/ps.txt 2>&1
  echo "batch 1 $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E 'scatter|_fused__softmax|_fused__to_copy_add_arange' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
done
timeout 280 python -m pytest -m gpu tests/test_gpu.py tests/test_sampling.py -q -p no:cacheprovider > $OUT/tests-gpu.txt 2>&1
echo "GPU tests rc $? $(tail -1 $OUT/tests-gpu.txt)"
date -u
