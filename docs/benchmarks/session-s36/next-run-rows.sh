# Prepared for the next device session (not run): the batched steps' projections as _fused_rows kernels,
# session s32's two forms rebased on main (s36): fused-rows-prenormed-s36.diff (all four projections, the
# norms as Inductor kernels before them) and fused-rows-hybrid-s36.diff (output and down only; QKV and
# gate/up stay cuBLAS), against main, at BATCHES (default 64; then "16 4", then "2 32", each a call).
# Both pass Triton's interpreter in fp32 (interpret_fused_rows.py). Trees, made here first:
#   for t in base pre hybrid; do rm -rf .$t; mkdir .$t; git archive HEAD engine scripts assets app pytest.ini \
#     $(git ls-files 'tests/*.py') | tar -x -C .$t; done
#   (cd .pre && patch -p1 -s < ../docs/benchmarks/session-s36/fused-rows-prenormed-s36.diff)
#   (cd .hybrid && patch -p1 -s < ../docs/benchmarks/session-s36/fused-rows-hybrid-s36.diff)
# carry: .whl .base .pre .hybrid. TESTS=1 runs the rows kernel's and the batched step's GPU tests in .pre first (the
# trees hold no fixtures: S1_FIXTURES_DIR points at the checkout's).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
if [ -n "${TESTS:-}" ]; then
  (cd .pre && S1_FIXTURES_DIR=$OLDPWD/tests/fixtures timeout 200 python -m pytest -m gpu tests/test_fused_linear.py \
    tests/test_batched_step.py -q -p no:cacheprovider) > $OUT/rows-tests.txt 2>&1
  echo "rows GPU tests rc $? $(tail -1 $OUT/rows-tests.txt | sed 's/warnings/w/')"
fi
for b in ${BATCHES:-64}; do
  for tree in .base .pre .hybrid; do
    (cd $tree && timeout 170 python scripts/profile_step.py --weights random --frames 40 --batch $b --kv 512) > $OUT/ps-b$b$tree.txt 2>&1
    echo "batch $b $tree rc $? $(grep graphed $OUT/ps-b$b$tree.txt)"
  done
done
date -u
