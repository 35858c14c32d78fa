# The read-back lag over HTTP: servers with S1_MINI_READ_BACK_LAG=1, 2, then 1 again (one machine),
# each the sustained cached mix twice (64 clients x 8); nvidia-smi samples the GPU's utilization
# every 100 ms meanwhile, and each level's start and end are marked, for the GPU's idle share.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 100 > $OUT/util.csv &
SMI=$!
mark() { echo "$1 $(date +%s.%N)" >> $OUT/marks.txt; }
i=0
for lag in ${LAGS:-1 2 1}; do
  i=$((i + 1))
  S1_MINI_READ_BACK_LAG=$lag python launch.py --random-weights --no-ui > $OUT/server-$i-lag$lag.txt 2>&1 &
  PID=$!
  until curl -sf http://127.0.0.1:7860/ready > /dev/null; do kill -0 $PID 2>/dev/null || exit 1; sleep 1; done
  timeout 100 python scripts/load_test.py --levels 64 --requests-per-client 1 > /dev/null 2>&1   # voices saved, clips seen
  for rep in a b; do
    mark "start $i-lag$lag$rep"
    timeout 100 python scripts/load_test.py --levels 64 --requests-per-client 8 --distinct-clips 21 \
      --json $OUT/http-$i-lag$lag$rep.json 2>&1 | grep -E "streams:" | sed "s/^/lag $lag: /"
    mark "end $i-lag$lag$rep"
  done
  kill -INT $PID; wait $PID
  grep -c Traceback $OUT/server-$i-lag$lag.txt
done
kill $SMI
date -u
