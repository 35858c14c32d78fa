# Run 1 (session 31): main's batch-1 step against d58d597 (before the position-0 trim) and against main + spread-sampler.diff
# Trees: . = main; .base2/ = git archive d58d597 engine scripts assets; .spread/ = main + spread-sampler.diff (engine scripts assets tests)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for tree in . .base2 .spread . .base2 .spread; do
  tag=$(basename $(cd $tree && pwd)); [ "$tree" = . ] && tag=main
  (cd $tree && timeout 100 python scripts/profile_step.py --weights random --frames 40 --json $OUT/ps-$tag.json) > $OUT/ps-$tag.txt 2>&1
  echo "$tag rc $? $(grep graphed $OUT/ps-$tag.txt)"
done
(cd .spread && timeout 60 python docs/benchmarks/session-cf87816/bench_sample.py run2) > $OUT/bench-sample.txt 2>&1; echo "bench rc $?"
grep -v Warn $OUT/bench-sample.txt | grep us
(cd .spread && timeout 120 python -m pytest -m gpu tests/test_sampling_kernel.py -q -p no:cacheprovider -x) > $OUT/gpu-tests-spread.txt 2>&1; echo "tests rc $?"
tail -3 $OUT/gpu-tests-spread.txt; date -u
