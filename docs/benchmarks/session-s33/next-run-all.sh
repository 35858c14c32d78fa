# Prepared for the next device session (not run): the four prepared diffs, each alone against main, in one call
# (PART=1, ~46 s a profile on a fresh machine: ten batch-1 profiles), then PART=2. Set up here first:
#   for t in base peeled penalty loads spec; do rm -rf .$t && mkdir .$t && git archive HEAD engine scripts assets app $(git ls-files 'tests/*.py') | tar -x -C .$t; done
#   (cd .peeled && patch -p1 < ../docs/benchmarks/session-s33/peeled-first-block.diff)
#   (cd .penalty && patch -p1 < ../docs/benchmarks/session-s33/compared-history.diff)
#   (cd .loads && patch -p1 < ../docs/benchmarks/session-s33/early-loads-fused-linear.diff)
#   (cd .spec && patch -p1 < ../docs/benchmarks/session-s33/speculative-fast-keys.diff)
#   carry: .whl .base .peeled .penalty .loads .spec (each tree ~1.4 MB)
# PART=2, after applying the winners to the working tree: the batch-64 step of .base and .peeled, and the GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1  # the trees differ in their kernels' or sampler's source, which keys the caches
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
if [ "${PART:-1}" = 1 ]; then
  for tree in .base .peeled .penalty .loads .spec .base .peeled .penalty .loads .spec; do
    (cd $tree && timeout 55 python scripts/profile_step.py --weights random --frames 40) > /tmp/ps.txt 2>&1
    echo "batch 1 $tree rc $? $(grep graphed /tmp/ps.txt)"
  done
else
  for tree in .base .peeled; do  # the peeled attention is the one change that reaches the batched steps
    (cd $tree && timeout 55 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512) > /tmp/ps.txt 2>&1
    echo "batch 64 $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend_split' /tmp/ps.txt | tr -s ' ')"
  done
  timeout 420 python -m pytest -m gpu tests/test_gpu.py tests/test_decode_attention.py tests/test_fused_linear.py \
    tests/test_sampling.py -q -p no:cacheprovider > $OUT/tests-gpu.txt 2>&1
  echo "GPU tests rc $? $(tail -1 $OUT/tests-gpu.txt)"
fi
date -u
