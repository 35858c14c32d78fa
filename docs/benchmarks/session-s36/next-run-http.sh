# Prepared for the next device session (not run): #5 over HTTP with the codec fix, bursts as before
# plus sustained levels of the cached mix (--distinct-clips 21: after the first round every inline
# clip is known), checking that the server survives 64 clients x 12 requests. carry: .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
python launch.py --random-weights --no-ui > $OUT/server.txt 2>&1 &
PID=$!
until curl -sf http://127.0.0.1:7860/ready > /dev/null; do kill -0 $PID 2>/dev/null || exit 1; sleep 1; done
date -u   # load_test.py waits for every batch's graphs itself
lt() { timeout 120 python scripts/load_test.py "$@" 2>&1 | grep -E "streams|by voice"; }
lt --levels 64 --requests-per-client 1 --json $OUT/load-first.json
lt --levels 64 --requests-per-client 1 --json $OUT/load-repeat.json
lt --levels 64 --requests-per-client 12 --distinct-clips 21 --json $OUT/load-sustained12.json --html $OUT/load-sustained12.html
lt --levels 64 --requests-per-client 4 --distinct-clips 21 --json $OUT/load-sustained4.json
lt --levels 1 --requests-per-client 20 --json $OUT/load-one.json
curl -s http://127.0.0.1:7860/ready; echo
kill -INT $PID; wait $PID; echo "server exit $?"
grep -c "vectorized_gather\|Traceback" $OUT/server.txt
# The same sustained level without HTTP (the engine warm from the server's caches): what HTTP costs.
timeout 200 python scripts/load_test.py --in-process --weights random --levels 64 --requests-per-client 8 \
  --distinct-clips 21 --json $OUT/inproc-sustained8.json 2>&1 | grep -E "streams|by voice"
date -u
