# Session s36, call 1: #5 over HTTP on main, as session-s35/next-run-5.sh (3 bursts of 64, one stream),
# plus a sustained level (64 clients, 4 requests each, back to back); then session-s35/l2_prefetch_probe.py.
# carry: .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
python launch.py --random-weights --no-ui > $OUT/server.txt 2>&1 &
PID=$!
for i in $(seq 1 240); do curl -sf http://127.0.0.1:7860/ready > /dev/null && break; sleep 1; done
all_ready() { curl -sf http://127.0.0.1:7860/ready | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["slots_ready"] < d["slots"] or d["capturing"])'; }
for j in $(seq 1 180); do all_ready && break; sleep 1; done
echo "ready ${i}s, every graph ${j}s more"
for run in first repeat repeat2; do
  timeout 120 python scripts/load_test.py --levels 64 --requests-per-client 1 --json $OUT/load-$run.json 2>&1 | grep streams
done
timeout 150 python scripts/load_test.py --levels 64 --requests-per-client 4 --json $OUT/load-sustained.json 2>&1 | grep streams
timeout 120 python scripts/load_test.py --levels 1 --requests-per-client 20 --json $OUT/load-one.json 2>&1 | grep streams
kill -INT $PID; wait $PID
date -u
timeout 120 python docs/benchmarks/session-s35/l2_prefetch_probe.py --json $OUT/l2.json 2>&1 | grep -v -i warn
date -u
