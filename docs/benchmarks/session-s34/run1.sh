python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 200 python -m pytest -m gpu tests/test_decode_attention.py tests/test_fused_linear.py -q -p no:cacheprovider -x > $OUT/tests-kernels.txt 2>&1
echo "kernel tests rc $? $(tail -1 $OUT/tests-kernels.txt)"
profile() {
  local tree=$1; shift
  (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40 "$@") > /tmp/ps.txt 2>&1
  echo "$* $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend|_fused_linear|_merge' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
}
for tree in .base . .ap16 .base . .ap16; do profile $tree; done
date -u
