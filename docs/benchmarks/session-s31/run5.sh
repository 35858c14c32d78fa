# Run 5 (session 31): the tuned launch table (working tree) against main (.base/ = git archive fecda99 engine scripts assets); GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for tree in . .base . .base; do
  tag=$(basename $(cd $tree && pwd)); [ "$tree" = . ] && tag=new
  (cd $tree && timeout 100 python scripts/profile_step.py --weights random --frames 40 --json $OUT/ps-$tag.json) > $OUT/ps-$tag.txt 2>&1
  echo "$tag rc $? $(grep graphed $OUT/ps-$tag.txt)"
done
timeout 100 python -m pytest -m gpu tests/test_fused_linear.py -q -p no:cacheprovider > $OUT/gpu-tests.txt 2>&1; echo "fused tests rc $?"; tail -1 $OUT/gpu-tests.txt
timeout 280 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider >> $OUT/gpu-tests.txt 2>&1; echo "gpu tests rc $?"; tail -1 $OUT/gpu-tests.txt
date -u
