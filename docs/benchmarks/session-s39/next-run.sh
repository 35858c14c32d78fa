# Prepared for the next device session (not run): main with read-back lag 2 by default.
# 0. The GPU test of trace_worker's --gpu-events (written in session s39, not yet run on a GPU).
# 1. Over HTTP, traced with --gpu-events: bursts of 64 (cached voices) and the sustained cached mix,
#    so that the summary shows what lag 2 left: the GPU's idle share (its "GPU with work" line), the
#    steps' pace, slots standing empty; one stream's first audio.
# 2. In process, the sustained mix at lag 2 and lag 1 (same machine), to check that the engine
#    alone is not slower with the extra step a sequence runs.
# Every file goes back in one tarball (a call returns at most 8 files). Set S1_COMMIT by hand: the
# device's copy of the repository has a stale HEAD. carry: .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:?set S1_COMMIT to the commit under test}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
R=/tmp/next; mkdir -p $R
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_trace_worker.py 2>&1 | tail -3
python scripts/trace_worker.py --gpu-events --out $R/trace-http.json launch.py --random-weights --no-ui > $R/server.txt 2>&1 &
PID=$!
until curl -sf http://127.0.0.1:7860/ready > /dev/null; do kill -0 $PID 2>/dev/null || exit 1; sleep 1; done
lt() { timeout 150 python scripts/load_test.py "$@" 2>&1 | grep -E "streams:"; }
lt --levels 64 --requests-per-client 1 --json $R/http-first.json
lt --levels 64,64 --requests-per-client 1 --json $R/http-bursts.json
lt --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $R/http-sustained8.json
lt --levels 1 --requests-per-client 20 --json $R/http-one.json
kill -INT $PID; wait $PID
echo "tracebacks: $(grep -c Traceback $R/server.txt)"
gzip $R/trace-http.json
python scripts/trace_worker.py --summary $R/trace-http.json.gz | grep -v '^burst'
for lag in 2 1; do
  timeout 200 python scripts/load_test.py --in-process --weights random --engine-option read_back_lag=$lag \
    --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $R/inproc-lag$lag.json 2>&1 \
    | grep -E "streams:" | sed "s/^/in process, lag $lag: /"
done
tar -czf $OUT/next.tar.gz -C /tmp next
date -u
