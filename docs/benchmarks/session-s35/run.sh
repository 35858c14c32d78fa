# Session 2026-11-27: batch-1 frames of prepared variants against main (with the side stream, da835de).
# Trees made here first (from the repository root), each carried to the device:
#   for t in base wk wkgu wkn2; do mkdir .$t && git archive HEAD engine scripts assets app $(git ls-files 'tests/*.py') | tar -x -C .$t; done
#   for t in wk wkgu wkn2; do (cd .$t && patch -p1 -s < ../docs/benchmarks/session-s34/whole-k-blocks.diff); done
#   .wkgu: gate/up block_k 1024; .wkn2: down block_n 2 (the seds of session-s34/next-run.sh)
#   .s32/.s128: copies of .base with ONE_ROW_SPLIT_KEYS 32/128; .record: .base + session-s34/record-kernel.diff
# TREES="..." ROUNDS=n picks what is timed; BATCH64="..." times those trees at batch 64 too; TESTS="pytest args" runs GPU tests at the root.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
profile() {
  local tree=$1; shift
  (cd $tree && timeout 150 python scripts/profile_step.py --weights random --frames 40 "$@") > /tmp/ps.txt 2>&1
  echo "$* $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend|_fused_linear|_merge|record' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
}
for round in $(seq ${ROUNDS:-2}); do for tree in ${TREES:-.base}; do profile $tree; done; done
for tree in ${BATCH64:-}; do profile $tree --batch 64 --kv 512; done
if [ -n "${TESTS:-}" ]; then
  timeout ${TESTS_LIMIT:-400} python -m pytest -m gpu $TESTS -q -p no:cacheprovider > $OUT/tests.txt 2>&1
  echo "GPU tests rc $? $(tail -1 $OUT/tests.txt | sed 's/warnings/w/')"
fi
date -u
