# Start-up on one machine: cold, then two warm starts sampled by sample_stacks.py (batch-1 graphs only).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
run() {
  env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc-k timeout 150 python "$@" --phase startup --cache-dir /tmp/cc-k \
    --weights random --device auto --precision auto --compile auto --compile-mode default --quantize none --max-batch-size 1
}
run scripts/benchmark.py > $OUT/cold.txt 2>&1; echo "cold rc $? $(tail -1 $OUT/cold.txt | cut -c1-330)"
for i in 1 2; do
  run docs/benchmarks/session-s35/sample_stacks.py $OUT/stacks-warm$i.txt scripts/benchmark.py > $OUT/warm$i.txt 2>&1
  echo "warm$i rc $? $(tail -1 $OUT/warm$i.txt | cut -c1-330)"
done
