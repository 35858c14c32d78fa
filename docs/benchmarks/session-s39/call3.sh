# Where the HTTP path loses against in process: the server under scripts/trace_worker.py, the
# sustained cached mix over HTTP, then the same mix in process under the tracer (one machine).
# The host's wait for the GPU's frame counts, per second of run, tells GPU-bound from host-bound.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
python scripts/trace_worker.py --out $OUT/trace-http.json launch.py --random-weights --no-ui > $OUT/server.txt 2>&1 &
PID=$!
until curl -sf http://127.0.0.1:7860/ready > /dev/null; do kill -0 $PID 2>/dev/null || exit 1; sleep 1; done
date -u
lt() { timeout 150 python scripts/load_test.py "$@" 2>&1 | grep -E "streams|by voice"; }
lt --levels 64 --requests-per-client 1 --json $OUT/http-first.json
lt --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $OUT/http-sustained8.json
kill -INT $PID; wait $PID; echo "server exit $?"
grep -c "Traceback" $OUT/server.txt
timeout 200 python scripts/trace_worker.py --out $OUT/trace-inproc.json scripts/load_test.py --in-process --weights random \
  --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $OUT/inproc-sustained8.json 2>&1 | grep -E "streams|by voice"
for t in http inproc; do gzip $OUT/trace-$t.json; echo "== $t"; python scripts/trace_worker.py --summary $OUT/trace-$t.json.gz | grep -v '^burst'; done
date -u
