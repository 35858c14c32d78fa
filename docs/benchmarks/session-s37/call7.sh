python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=cfedb76
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 300 python scripts/trace_worker.py --out $OUT/trace-sustained.json scripts/load_test.py --in-process --weights random \
  --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $OUT/inproc-traced.json 2>&1 | grep -E "streams|by voice|trace"
gzip $OUT/trace-sustained.json
python scripts/trace_worker.py --summary $OUT/trace-sustained.json.gz | head -30
date -u
