# Prepared for the next device session (not run). Set S1_COMMIT by hand (the device's copy of the
# repository has a stale HEAD). carry: .whl .prev (PART=ab); .whl .rb (PART=buckets); .whl (PART=tests, PART=http)
#   .prev: rm -rf .prev && mkdir .prev && git archive 0b90a59 engine scripts assets app launch.py | tar -x -C .prev
#   (0b90a59: main before the host-scalar fix, with the read-back lag 2 and the GPU events; add .prev to .git/info/exclude)
# PART=tests: the GPU tests written in session s39 after its device time was spent: the decode loop
#   and codec under torch's sync debug mode, and trace_worker's --gpu-events; then
#   scripts/profile_codec_calls.py (new, not yet run): a codec call's fixed and per-row cost.
# PART=ab: in process, the sustained mix traced with --gpu-events, main against .prev (main, prev,
#   main): did the fills on the device (no stream wait at each retirement) raise the GPU's busy
#   share and the throughput?
# PART=http: over HTTP, traced with --gpu-events: bursts, the sustained mix, one stream.
# PART=buckets: branch codec-row-buckets (codec graphs for 3, 6, 12, 24, 48 rows too) as .rb:
#   its codec GPU tests, then in process, the sustained mix, .rb against main (rb, main, rb). carry: .whl .rb
#   .rb: rm -rf .rb && mkdir .rb && git archive codec-row-buckets engine scripts assets app pytest.ini launch.py \
#          $(git ls-tree -r --name-only codec-row-buckets tests | grep '\.py$') | tar -x -C .rb
# Every file goes back in one tarball (a call returns at most 8 files).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:?set S1_COMMIT to the commit under test}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
R=/tmp/next; mkdir -p $R
if [ "${PART:-tests}" = tests ]; then
  S1_FIXTURES_DIR=$PWD/tests/fixtures timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_trace_worker.py \
    "tests/test_gpu.py::test_the_decode_loop_and_codec_never_wait_for_the_gpu_outside_their_read_backs" 2>&1 | tail -15
  # one codec call's cost per row bucket and length (the fixed part and the part per row)
  PYTHONPATH=/tmp/site:. timeout 240 python scripts/profile_codec_calls.py --weights random \
    --row-buckets 1,2,3,4,6,8,12,16,24,32,48,64 --json $R/codec-calls.json 2>&1 | grep -v Warn
elif [ "$PART" = ab ] || [ "$PART" = buckets ]; then
  if [ "$PART" = buckets ]; then
    (cd .rb && S1_FIXTURES_DIR=$OLDPWD/tests/fixtures PYTHONPATH=/tmp/site:. timeout 240 python -m pytest -q \
      -p no:cacheprovider -k codec tests/test_gpu.py tests/test_codec_runner.py tests/test_engine_batching.py 2>&1 | tail -3)
  fi
  n=0
  for tree in ${TREES:-$([ "$PART" = ab ] && echo main prev main || echo rb main rb)}; do
    n=$((n + 1)); dir=.; [ $tree = prev ] && dir=.prev; [ $tree = rb ] && dir=.rb
    (cd $dir && PYTHONPATH=/tmp/site:. timeout 240 python scripts/trace_worker.py --gpu-events --out $R/trace-$n-$tree.json \
      scripts/load_test.py --in-process --weights random --levels 64 --requests-per-client 8 --distinct-clips 21 \
      --json $R/inproc-$n-$tree.json 2>&1 | grep -E "streams:" | sed "s/^/$tree: /")
    # the level's stretch: from 1.5 s after its first request (the 512th submission from the end) to its last
    window=$(python -c "import json,sys; t=sorted(s[2] for s in json.load(open(sys.argv[1])) if s[0]=='job_submit'); print(t[-512]+1.5, t[-1])" $R/trace-$n-$tree.json)
    PYTHONPATH=/tmp/site:. python scripts/trace_worker.py --summary $R/trace-$n-$tree.json --window $window \
      | grep -E "GPU with work|gpu_step|gpu_codec|batched steps|^retire " | sed "s/^/$tree: /"
    gzip -f $R/trace-$n-$tree.json
  done
else
  export PYTHONPATH=/tmp/site:.
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
fi
tar -czf $OUT/next-${PART:-tests}.tar.gz -C /tmp next
date -u
