# Prepared for a device run (not run): one path for every batch size (peeled-first-block.diff): each split's
# first block of keys requested before the query math (as main does for one row), its other blocks loaded in
# the loop as Triton pipelines them (as main does for batches); the new key and value from registers.
# Before: .base/ = git archive <main> engine scripts assets app; then patch -p1 < docs/benchmarks/session-s33/peeled-first-block.diff
# here; .whl/ = the wheels the device lacks; .base/ and .whl/ named in the run's carry.
# Without a GPU (sm_90a, ptxas -v): 229 registers for one row (main 227), 247 for batches (main 255 and 720 bytes
# of spills), 128 for the fast transformer's direct path (main: 128 one row, 72 batches); no spills.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1  # the trees differ in their kernels' source, which keys the caches
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
if [ "${PART:-1}" = 2 ]; then
  timeout 280 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider > $OUT/tests-gpu.txt 2>&1
  echo "test_gpu rc $? $(tail -1 $OUT/tests-gpu.txt)"; date -u; exit
fi
timeout 80 python -m pytest -m gpu tests/test_decode_attention.py -q -p no:cacheprovider > $OUT/tests-attention.txt 2>&1
echo "attention tests rc $? $(tail -1 $OUT/tests-attention.txt)"
# ~45 s a profile on a fresh machine (cold compiles): ten fit beside the attention tests in one call.
for case in "--batch 1|. .base . .base" "--batch 64 --kv 512|. .base . .base" "--batch 16 --kv 1024|. .base"; do
  shape=${case%|*}
  for tree in ${case#*|}; do
    (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40 $shape) > /tmp/ps.txt 2>&1
    echo "$shape $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend_split' /tmp/ps.txt | tr -s ' ')"
  done
done
date -u
# Then PART=2 (tests/test_gpu.py) in a second call.
