# The read-back lag over HTTP, 3 against 2 (call 4 gave 2 against 1): the same sustained cached mix
# twice per server (64 clients x 8), then one stream (20 requests) for its first audio. Every file
# goes back in one tarball (a call returns at most 8 files).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
R=/tmp/call5; mkdir -p $R
i=0
for lag in ${LAGS:-3 2}; do
  i=$((i + 1))
  S1_MINI_READ_BACK_LAG=$lag python launch.py --random-weights --no-ui > $R/server-$i-lag$lag.txt 2>&1 &
  PID=$!
  until curl -sf http://127.0.0.1:7860/ready > /dev/null; do kill -0 $PID 2>/dev/null || exit 1; sleep 1; done
  timeout 100 python scripts/load_test.py --levels 64 --requests-per-client 1 > /dev/null 2>&1   # voices saved, clips seen
  for rep in a b; do
    timeout 100 python scripts/load_test.py --levels 64 --requests-per-client 8 --distinct-clips 21 \
      --json $R/http-$i-lag$lag$rep.json 2>&1 | grep -E "streams:" | sed "s/^/lag $lag: /"
  done
  timeout 60 python scripts/load_test.py --levels 1 --requests-per-client 20 --json $R/http-$i-lag$lag-one.json 2>&1 \
    | grep -E "streams:" | sed "s/^/lag $lag: /"
  kill -INT $PID; wait $PID
  echo "tracebacks: $(grep -c Traceback $R/server-$i-lag$lag.txt)"
done
tar -czf $OUT/call5.tar.gz -C /tmp call5
date -u
