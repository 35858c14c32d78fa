# Batch-64 step of ab0a615 (.pre) against main; then main's cold start and a warm start under cProfile.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
for tree in .pre . .pre .; do
  (cd $tree && timeout 150 python scripts/profile_step.py --weights random --frames 40 --batch 64 --kv 512) > /tmp/ps.txt 2>&1
  echo "b64 $tree rc $? $(grep graphed /tmp/ps.txt)"
done
start() {
  env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc-main timeout 150 python "$@" --phase startup --cache-dir /tmp/cc-main \
    --weights random --device auto --precision auto --compile auto --compile-mode default --quantize none --max-batch-size 1
}
start scripts/benchmark.py > $OUT/cold.txt 2>&1; echo "cold rc $? $(tail -1 $OUT/cold.txt | cut -c1-300)"
start scripts/benchmark.py > $OUT/warm1.txt 2>&1; echo "warm rc $? $(tail -1 $OUT/warm1.txt | cut -c1-300)"
start -m cProfile -o $OUT/warm.prof scripts/benchmark.py > $OUT/warm-prof.txt 2>&1; echo "warm cProfile rc $? $(tail -1 $OUT/warm-prof.txt | cut -c1-300)"
date -u
