# Session s42's device calls (sessions s40-s41's run.sh, moved here; results in /tmp/s42): several parts per
# call (PARTS), the results packed after every run, so that a call cut short still brings back what it
# finished.
# Set S1_COMMIT by hand (the device's copy of the repository has a stale HEAD). Trees, each in a
# folder .git/info/exclude ignores (branches rebased on main c32d2e3):
#   for b in "codec-row-buckets .rb" "aligned-blocks .al"; do set -- $b; rm -rf $2 && mkdir $2 && \
#     git archive $1 engine scripts assets app pytest.ini launch.py \
#       $(git ls-tree -r --name-only $1 tests | grep '\.py$') | tar -x -C $2; done
# (prepared after session s40's calls: "held-outputs .ho" and "aligned-held .ah" the same way;
# TREES="main ho ah" then names them.)
# Parts:
#   tests:  the GPU tests written in session s39 after its device time was spent (the decode loop and
#           codec under torch's sync debug mode; trace_worker's --gpu-events)
#   codec:  scripts/profile_codec_calls.py: a codec call's fixed and per-row cost per bucket and length
#   gputests: test_gpu.py and test_engine_batching.py (and test_codec_runner.py) of the tree TREE
#   trees:  in process, the sustained mix traced with --gpu-events, one run per tree in TREES
#           main: host-scalar fix, lag 2. rb: + codec graphs for 3, 6, 12, 24, 48 rows.
#           al: rb + hand-outs aligned on a shared clock (one codec call for every stream's block).
#   http:   over HTTP, one server per tree in TREES, traced with --gpu-events: the sustained mix twice, one stream
#   admission (added after session s40's calls, not yet run): over HTTP on main, one server per
#           admission setting in SETTINGS (GATHER_STEPS:MIN_LEAD_S, default "4:0.25 4:0 2:0 0:0";
#           4:0.25 is the default), each the sustained mix twice. A level first warms the machine:
#           the first level of a fresh machine was the slowest of session s40's calls.
#   allag (added after session s40's calls, not yet run; carry .al): over HTTP on aligned-blocks, one
#           server per read-back lag in LAGS (default "3 4"), each the sustained mix twice: its host
#           work between two read-backs was 22-23 ms p90, more than the two steps queued at lag 2.
#   alltests (session s42): gputests' files, every GPU test, each result kept as it comes
# The parts probe, greentests and share (sessions s41-s42: the codec on a share of the SMs, and codec
# calls waiting on the host) are in this script as of 203edd0; the settings they swept were removed
# from the engine after session s42's calls (docs/PERFORMANCE.md says why).
# Every server part runs `serve` below (the http, admission and allag parts as before, with one function).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:?set S1_COMMIT to the commit under test}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
R=/tmp/s42; mkdir -p $R
ROOT=$PWD
dir_of() { case $1 in main) echo $ROOT ;; *) echo $ROOT/.$1 ;; esac; }
pack() { tar -czf $OUT/s42-${PARTS// /-}.tar.gz -C /tmp s42; }
# serve TAG [--gpu-events] [one]: a server of the tree in the current directory, with the settings in
# the environment, under trace_worker; a warm-up level on a fresh machine (its first level was the slowest of
# session s40's calls; not counted), the sustained mix twice (64 clients x 8), with "one" one stream's
# first audio; then its tracebacks counted and everything packed. LOAD_ARGS: more load_test.py arguments for
# the sustained levels (e.g. "--length-spread 0.2", added after session s41's calls), LOAD_TAG: a suffix for
# the files' names. SPREAD (session s42): after those levels, the sustained mix twice more with
# --length-spread SPREAD, on the same server.
serve() {
  local tag=$1${LOAD_TAG:+-$LOAD_TAG} events=$2 one=$3
  [ "$events" = one ] && { events=; one=one; }
  PYTHONPATH=/tmp/site:. python scripts/trace_worker.py $events --out $R/trace-$tag.json launch.py --random-weights --no-ui \
    > $R/server-$tag.txt 2>&1 &
  local pid=$!
  until curl -sf http://127.0.0.1:7860/ready > /dev/null; do kill -0 $pid 2>/dev/null || return 1; sleep 1; done
  lt() { PYTHONPATH=/tmp/site:. timeout 150 python scripts/load_test.py "$@" 2>&1 | grep -E "streams:" | sed "s/^/$tag: /"; }
  [ -e $R/warmed ] || { lt --levels 64 --requests-per-client 4 | sed "s/^/warm-up, not counted: /"; touch $R/warmed; }
  lt --levels 64,64 --requests-per-client 8 --distinct-clips 21 $LOAD_ARGS --json $R/http-sustained8-$tag.json
  [ -n "$SPREAD" ] && lt --levels 64,64 --requests-per-client 8 --distinct-clips 21 --length-spread $SPREAD \
    --json $R/http-sustained8-$tag-spread$SPREAD.json | sed "s/^/spread $SPREAD: /"
  [ -n "$one" ] && lt --levels 1 --requests-per-client 20 --json $R/http-one-$tag.json
  kill -INT $pid; wait $pid
  echo "$tag tracebacks: $(grep -c Traceback $R/server-$tag.txt)"
  gzip -f $R/trace-$tag.json $R/server-$tag.txt
  pack
}
for PART in ${PARTS:?name the parts}; do
  echo "== $PART $(date -u +%T)"
  case $PART in
  tests)
    S1_FIXTURES_DIR=$ROOT/tests/fixtures timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_trace_worker.py \
      "tests/test_gpu.py::test_the_decode_loop_and_codec_never_wait_for_the_gpu_outside_their_read_backs" 2>&1 | tail -15 ;;
  codec)
    PYTHONPATH=/tmp/site:. timeout 240 python scripts/profile_codec_calls.py --weights random \
      --row-buckets 1,2,3,4,6,8,12,16,24,32,48,64 --json $R/codec-calls.json 2>&1 | grep -v Warn ;;
  gputests)
    (cd $(dir_of ${TREE:-main}) && S1_FIXTURES_DIR=$ROOT/tests/fixtures PYTHONPATH=/tmp/site:. timeout 500 python -m pytest -q \
      -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_engine_batching.py tests/test_codec_runner.py \
      2>&1 | tail -6) ;;
  trees)
    n=0
    for tree in ${TREES:-main rb al}; do
      n=$((n + 1))
      (cd $(dir_of $tree) && PYTHONPATH=/tmp/site:. timeout 200 python scripts/trace_worker.py --gpu-events --out $R/trace-$n-$tree.json \
        scripts/load_test.py --in-process --weights random --levels 64 --requests-per-client 8 --distinct-clips 21 \
        --json $R/inproc-$n-$tree.json 2>&1 | grep -E "streams:|Error|error" | sed "s/^/$tree: /")
      # the level's stretch: from 1.5 s after its first request (the 512th submission from the end) to its last
      window=$(python -c "import json,sys; t=sorted(s[2] for s in json.load(open(sys.argv[1])) if s[0]=='job_submit'); print(t[-512]+1.5, t[-1])" $R/trace-$n-$tree.json)
      PYTHONPATH=/tmp/site:. python scripts/trace_worker.py --summary $R/trace-$n-$tree.json --window $window \
        | grep -E "GPU with work|gpu_step|gpu_codec|batched steps|codec calls|^retire |steps/s|between" | sed "s/^/$tree: /"
      gzip -f $R/trace-$n-$tree.json
      pack
    done ;;
  http)
    # one server per tree in TREES: the sustained mix twice (64 clients x 8), then one stream's first audio
    for tree in ${TREES:-main}; do
      (cd $(dir_of $tree) && serve $tree --gpu-events one)
    done ;;
  admission)
    for setting in ${SETTINGS:-4:0.25 4:0 2:0 0:0}; do
      S1_MINI_ADMIT_GATHER_STEPS=${setting%%:*} S1_MINI_ADMIT_MIN_LEAD_S=${setting##*:} serve g${setting%%:*}-l${setting##*:}
    done ;;
  allag)
    for lag in ${LAGS:-3 4}; do
      (cd $(dir_of al) && S1_MINI_READ_BACK_LAG=$lag serve al-lag$lag --gpu-events)
    done ;;
  alltests)
    # (session s42) gputests' tests, each result kept as it comes ($R/gpu-tests.txt)
    S1_FIXTURES_DIR=$ROOT/tests/fixtures PYTHONPATH=/tmp/site:. timeout ${TESTS_S:-560} python -m pytest -v -p no:cacheprovider \
      -m gpu tests/test_gpu.py tests/test_engine_batching.py tests/test_codec_runner.py --durations 8 2>&1 \
      | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|s call|s setup|Error" > $R/gpu-tests.txt; tail -14 $R/gpu-tests.txt ;;
  esac
  pack
done
date -u
