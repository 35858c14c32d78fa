# Prepared for the next device session (not run). Set S1_COMMIT by hand (the device's copy of the
# repository has a stale HEAD). Trees for the branches, each in a folder .git/info/exclude ignores:
#   for b in "codec-row-buckets .rb" "aligned-blocks .al"; do set -- $b; rm -rf $2 && mkdir $2 && \
#     git archive $1 engine scripts assets app pytest.ini launch.py \
#       $(git ls-tree -r --name-only $1 tests | grep '\.py$') | tar -x -C $2; done
#   (and .prev, main before the host-scalar fix: git archive 0b90a59 engine scripts assets app launch.py)
# PART=tests (carry .whl): the GPU tests written in session s39 after its device time was spent (the
#   decode loop and codec under torch's sync debug mode; trace_worker's --gpu-events), then
#   scripts/profile_codec_calls.py (new): a codec call's fixed and per-row cost per bucket and length.
# PART=tests2 (carry .whl): main's test_gpu.py and test_engine_batching.py on the GPU (~6 min).
# PART=branchtests (carry .whl .rb .al): the branches' GPU tests on codec, scheduler and batching.
# PART=trees (carry .whl .rb .al; .prev too if TREES names it): in process, the sustained mix traced
#   with --gpu-events, one run per tree in TREES (default: main rb al main): the GPU's busy share,
#   the steps' pace, the codec calls and the throughput of each.
#   main: host-scalar fix, lag 2. rb: + codec graphs for 3, 6, 12, 24, 48 rows.
#   al: rb + hand-outs aligned on a shared clock (one codec call for every stream's block).
# PART=http (carry .whl, and the tree named by TREE, default main): over HTTP, traced with
#   --gpu-events: bursts, the sustained mix, one stream.
# Every file goes back in one tarball (a call returns at most 8 files).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:?set S1_COMMIT to the commit under test}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
R=/tmp/next; mkdir -p $R
dir_of() { case $1 in main) echo . ;; *) echo .$1 ;; esac; }
if [ "${PART:-tests}" = tests ]; then
  S1_FIXTURES_DIR=$PWD/tests/fixtures timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_trace_worker.py \
    "tests/test_gpu.py::test_the_decode_loop_and_codec_never_wait_for_the_gpu_outside_their_read_backs" 2>&1 | tail -15
  PYTHONPATH=/tmp/site:. timeout 240 python scripts/profile_codec_calls.py --weights random \
    --row-buckets 1,2,3,4,6,8,12,16,24,32,48,64 --json $R/codec-calls.json 2>&1 | grep -v Warn
elif [ "$PART" = tests2 ]; then
  # main's scheduler and engine on the GPU since the last run of these (read-back lag 2 ran them;
  # since then: fills instead of host scalars, frame counts read every END_CHECK_STEPS steps)
  S1_FIXTURES_DIR=$PWD/tests/fixtures timeout 500 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py \
    tests/test_engine_batching.py 2>&1 | tail -4
elif [ "$PART" = branchtests ]; then
  for tree in rb al; do
    echo "== $tree"
    (cd $(dir_of $tree) && S1_FIXTURES_DIR=$OLDPWD/tests/fixtures PYTHONPATH=/tmp/site:. timeout 270 python -m pytest -q \
      -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_engine_batching.py tests/test_codec_runner.py 2>&1 | tail -4)
  done
elif [ "$PART" = trees ]; then
  n=0
  for tree in ${TREES:-main rb al main}; do
    n=$((n + 1))
    (cd $(dir_of $tree) && PYTHONPATH=/tmp/site:. timeout 200 python scripts/trace_worker.py --gpu-events --out $R/trace-$n-$tree.json \
      scripts/load_test.py --in-process --weights random --levels 64 --requests-per-client 8 --distinct-clips 21 \
      --json $R/inproc-$n-$tree.json 2>&1 | grep -E "streams:" | sed "s/^/$tree: /")
    # the level's stretch: from 1.5 s after its first request (the 512th submission from the end) to its last
    window=$(python -c "import json,sys; t=sorted(s[2] for s in json.load(open(sys.argv[1])) if s[0]=='job_submit'); print(t[-512]+1.5, t[-1])" $R/trace-$n-$tree.json)
    PYTHONPATH=/tmp/site:. python scripts/trace_worker.py --summary $R/trace-$n-$tree.json --window $window \
      | grep -E "GPU with work|gpu_step|gpu_codec|batched steps|codec calls|^retire " | sed "s/^/$tree: /"
    gzip -f $R/trace-$n-$tree.json
  done
else
  export PYTHONPATH=/tmp/site:.
  cd $(dir_of ${TREE:-main})
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
