# Prepared for the next device session (not run): rows of one saved voice read its prefix from one row,
# session s32's shared-prefix-reads rebased on main (shared-prefix-reads-s36.diff; the kernel checked in
# Triton's interpreter: session-s32/interpret_shared_prefix.py). Exact by construction (the same values, read from
# another slot), so its GPU tests compare codes alone and in a batch; then the load test's 64-stream mix
# in process (a third of the rows in two saved voices), against main, trees alternating.
# Trees, made here first:
#   for t in base spr; do rm -rf .$t; mkdir .$t; git archive HEAD engine scripts assets app pytest.ini \
#     $(git ls-files 'tests/*.py') | tar -x -C .$t; done
#   (cd .spr && patch -p1 -s < ../docs/benchmarks/session-s36/shared-prefix-reads-s36.diff)
# carry: .whl .base .spr. STEPS="tests" (GPU tests, ~200 s), then STEPS="base spr base spr" (each tree compiles
# cold once; ~120 s a load test after): one call each.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
for step in ${STEPS:-tests}; do
  if [ "$step" = tests ]; then
    (cd .spr && S1_FIXTURES_DIR=$OLDPWD/tests/fixtures timeout 400 python -m pytest -m gpu tests/test_decode_attention.py \
      tests/test_gpu.py -k "prefix or fp32 or bf16 or alone or batch" -q -p no:cacheprovider) > $OUT/spr-tests.txt 2>&1
    echo "GPU tests rc $? $(tail -1 $OUT/spr-tests.txt | sed 's/warnings/w/')"; continue
  fi
  (cd .$step && timeout 280 python scripts/load_test.py --in-process --weights random --levels 64,64,64 \
    --requests-per-client 1 --distinct-clips 21 --json $OUT/lt-$step-$(date +%s).json) > /tmp/lt.txt 2>&1
  echo "$step rc $? $(grep streams: /tmp/lt.txt | tr -s ' ' | tr '\n' '|')"
done
date -u
