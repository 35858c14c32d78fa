# Prepared for the next device session (not run): the three prepared diffs, each alone against main, in one call
# (~46 s a profile on a fresh machine: ten profiles fit in 600 s). Set up here first:
#   for t in base peeled penalty loads; do rm -rf .$t && mkdir .$t && git archive HEAD engine scripts assets app $(git ls-files 'tests/*.py') | tar -x -C .$t; done
#   (cd .peeled && patch -p1 < ../docs/benchmarks/session-s33/peeled-first-block.diff)
#   (cd .penalty && patch -p1 < ../docs/benchmarks/session-s33/compared-history.diff)
#   (cd .loads && patch -p1 < ../docs/benchmarks/session-s33/early-loads-fused-linear.diff)
#   carry: .whl .base .peeled .penalty .loads (each tree ~1 MB)
# Then apply the winners to the working tree and run their GPU tests in a second call:
#   python -m pytest -m gpu tests/test_gpu.py tests/test_decode_attention.py tests/test_fused_linear.py tests/test_sampling.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1  # the trees differ in their kernels' or sampler's source, which keys the caches
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for tree in .base .peeled .penalty .loads .base .peeled .penalty .loads; do
  (cd $tree && timeout 55 python scripts/profile_step.py --weights random --frames 40) > /tmp/ps.txt 2>&1
  echo "batch 1 $tree rc $? $(grep graphed /tmp/ps.txt)"
done
for tree in .base .peeled; do  # the peeled attention is the one change that reaches the batched steps
  (cd $tree && timeout 55 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512) > /tmp/ps.txt 2>&1
  echo "batch 64 $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend_split' /tmp/ps.txt | tr -s ' ')"
done
date -u
