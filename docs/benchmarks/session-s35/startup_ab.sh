# Start-up A/B on one machine: for each tree, a cold start then a warm one (fresh cache and bytecode
# folders per tree), batch-1 graphs only (--max-batch-size 1), benchmark.py's start-up phase.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for tree in ${TREES:-.pre .}; do
  tag=$(echo $tree | tr -dc a-z); tag=${tag:-main}
  for i in cold warm ${EXTRA_WARM:-}; do
    (cd $tree && env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc-$tag timeout 150 python scripts/benchmark.py --phase startup --cache-dir /tmp/cc-$tag \
      --weights random --device auto --precision auto --compile auto --compile-mode default --quantize none --max-batch-size 1) > $OUT/startup-$tag-$i.txt 2>&1
    echo "$tree $i rc $? $(tail -1 $OUT/startup-$tag-$i.txt | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print({k: round(v, 1) for k, v in d.items() if isinstance(v, float)}, d["torch_compile_s"])' 2>&1)"
  done
done
