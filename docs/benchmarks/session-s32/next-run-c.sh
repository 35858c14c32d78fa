# Prepared for a device run (not run): rows of one saved voice read its prefix from one row (shared-prefix-reads.diff):
# its GPU tests, then the load test's 64-stream mix in process (a third of the rows in two saved voices) against main.
# Before: .base/ = git archive <main> engine scripts assets; then git apply docs/benchmarks/session-s32/shared-prefix-reads.diff
# here; .whl/ = the wheels the device lacks; .base/ and .whl/ named in the run's carry. TREES as below.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
# One call may run 600 s and each tree compiles cold on a fresh machine: call it twice, TREES="tests new", then TREES="base new".
for tag in ${TREES:-tests new}; do
  if [ "$tag" = tests ]; then
    timeout 200 python -m pytest -m gpu tests/test_decode_attention.py tests/test_gpu.py -k "prefix or fp32 or bf16 or alone" -q \
      -p no:cacheprovider > $OUT/gpu-tests.txt 2>&1
    echo "gpu tests rc $?"; tail -1 $OUT/gpu-tests.txt; continue
  fi
  tree=.; [ "$tag" = base ] && tree=.base
  (cd $tree && timeout 280 python scripts/load_test.py --in-process --weights random --levels 64,64 --json $OUT/lt-$tag.json) > $OUT/lt-$tag.txt 2>&1
  echo "$tag rc $? $(grep -i 'audio-s/s\|audio_s_per_s' $OUT/lt-$tag.txt | tail -2 | tr '\n' ' ')"
done
date -u
