# Run 3 (session 31): fused_linear lets the next kernel launch at its start (working tree) against main (.base/ = git archive fecda99 engine scripts assets)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for tree in . .base . .base; do
  tag=$(basename $(cd $tree && pwd)); [ "$tree" = . ] && tag=new
  (cd $tree && timeout 100 python scripts/profile_step.py --weights random --frames 40 --json $OUT/ps-$tag.json) > $OUT/ps-$tag.txt 2>&1
  echo "$tag rc $? $(grep graphed $OUT/ps-$tag.txt)"
done
timeout 150 python -m pytest -m gpu tests/test_fused_linear.py -q -p no:cacheprovider -x > $OUT/gpu-tests.txt 2>&1; echo "fused tests rc $?"; tail -2 $OUT/gpu-tests.txt
timeout 200 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -x -k "graphed or alone or logits_close" >> $OUT/gpu-tests.txt 2>&1; echo "step tests rc $?"; tail -2 $OUT/gpu-tests.txt
timeout 200 python scripts/bench_fused_linear.py --json $OUT/bfl.json > $OUT/bfl.txt 2>&1; echo "bfl rc $?"; grep -v Warn $OUT/bfl.txt | tail -8
date -u
