# Prepared for the next device session (not run): the five prepared diffs, each alone against main (.base/).
# ~46 s a profile on a fresh machine (cold compiles), so three calls of at most 600 s:
#   PART=1: batch-1 frames of .base .peeled .penalty .loads, twice each (8 profiles);
#   PART=2: batch-1 frames of .base .spec .nucleus, twice each, and the batch-64 step of .base and .peeled (8);
#   PART=3, after applying the winners to the working tree: their GPU tests.
# Set up here first:
#   for t in base peeled penalty loads spec nucleus; do rm -rf .$t && mkdir .$t && git archive HEAD engine scripts assets app $(git ls-files 'tests/*.py') | tar -x -C .$t; done
#   (cd .peeled && patch -p1 < ../docs/benchmarks/session-s33/peeled-first-block.diff)
#   (cd .penalty && patch -p1 < ../docs/benchmarks/session-s33/compared-history.diff)
#   (cd .loads && patch -p1 < ../docs/benchmarks/session-s33/early-loads-fused-linear.diff)
#   (cd .spec && patch -p1 < ../docs/benchmarks/session-s33/speculative-fast-keys.diff)
#   (cd .nucleus && patch -p1 < ../docs/benchmarks/session-s33/tiled-nucleus.diff)
#   carry: .whl and the trees the part uses (each ~1.4 MB)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1  # the trees differ in their kernels' or sampler's source, which keys the caches
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u

profile() {  # tree, then profile_step's shape arguments
  local tree=$1; shift
  (cd $tree && timeout 55 python scripts/profile_step.py --weights random --frames 40 "$@") > /tmp/ps.txt 2>&1
  echo "$* $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend_split|_fused_linear|nucleus' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
}

case "${PART:-1}" in
  1) for tree in .base .peeled .penalty .loads .base .peeled .penalty .loads; do profile $tree; done ;;
  2) for tree in .base .spec .nucleus .base .spec .nucleus; do profile $tree; done
     for tree in .base .peeled; do profile $tree --batch 64 --kv 512; done ;;  # the one change batches reach
  3) timeout 560 python -m pytest -m gpu tests/test_gpu.py tests/test_decode_attention.py tests/test_fused_linear.py \
       tests/test_sampling.py -q -p no:cacheprovider > $OUT/tests-gpu.txt 2>&1
     echo "GPU tests rc $? $(tail -1 $OUT/tests-gpu.txt)" ;;
esac
date -u
