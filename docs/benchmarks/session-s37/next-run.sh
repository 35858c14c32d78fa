# Prepared for the next device session (not run): where a slot stands empty under sustained load, and
# the decode steps' stream priority under it. Session s37's trace (call 7) found 7.0 of 64 slots free
# per iteration with no request waiting, 1.6 with requests waiting: the closed loop's turnaround
# (last frames decoded, delivered, the client's next request prepared and admitted) costs more
# than any codec call. The new start/retire spans time it per slot. carry: .whl (~60 s + ~70 s a run)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 200 python scripts/trace_worker.py --out $OUT/trace.json scripts/load_test.py --in-process --weights random \
  --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $OUT/traced.json 2>&1 | grep -E "streams:|trace"
gzip $OUT/trace.json
python scripts/trace_worker.py --summary $OUT/trace.json.gz | grep -E "^(steps|free|a slot|codec calls)"
lt() { timeout 110 python scripts/load_test.py --in-process --weights random "$@" 2>&1 | grep -E "streams:|rror"; }
for priority in false true; do
  echo "decode_priority=$priority sustained"
  lt --engine-option decode_priority=$priority --levels 64,64 --requests-per-client 8 --distinct-clips 21 \
    --json $OUT/sustained-priority-$priority.json
done
date -u
