# Run 5 (call H): the batch-1 attention launched with PDL (decode_attention_one_row) in the working tree "."
# against .base = git archive of f77bdee's successor docs commit (engine as f77bdee); then the GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
date -u
timeout 150 python -m pytest -m gpu tests/test_decode_attention.py tests/test_fused_linear.py -q -p no:cacheprovider > $OUT/tests-kernels.txt 2>&1
echo "kernel tests rc $? $(tail -1 $OUT/tests-kernels.txt)"
profile() {
  local tree=$1; shift
  (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40 "$@") > /tmp/ps.txt 2>&1
  echo "$* $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend|_fused_linear|_merge' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
}
for tree in .base . .base .; do profile $tree; done
date -u
timeout 300 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider > $OUT/tests-gpu.txt 2>&1
echo "test_gpu rc $? $(tail -1 $OUT/tests-gpu.txt)"
date -u
