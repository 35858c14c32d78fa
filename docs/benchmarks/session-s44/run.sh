# Session s44's device calls. Several parts per call (PARTS), results packed after every part (a call
# cut short still brings back what it finished). Each tree is a `git archive` of a commit in an ignored
# folder, carried with the call, so that edits made here while a call is sent change nothing:
#   rm -rf .X && mkdir .X && git archive <commit> engine scripts assets app tests pytest.ini launch.py | tar -x -C .X && rm -r .X/tests/fixtures
# (the tests read the fixtures of the working tree, which travels: S1_FIXTURES_DIR)
# TREES names those folders without the dot (TREES="X Y": .X and .Y); S1_COMMIT labels the outputs.
# Parts:
#   tests:   the GPU tests in TEST_FILES (default: the engine's and the codec's GPU test files), first tree
#   kernels: the codec's kernels by GPU time, 1 row x 4 frames and 8 rows x 32 frames (profile_batch), first tree
#   codec:   scripts/profile_codec_calls.py per tree (a codec call's fixed and per-row cost; its parts' times where
#            the tree's script has --parts: CODEC_PARTS); CODEC_TREES: the trees to profile (default TREES)
#   http:    one server per tree: a warm-up level on a fresh machine (not counted), the sustained mix
#            twice (64 clients x 8), one stream's first audio; traced (trace_worker --gpu-events)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:?set S1_COMMIT to the commit under test}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
R=/tmp/s44; mkdir -p $R
ROOT=$PWD
set -- ${TREES:?name the trees}; FIRST=$1
pack() { tar -czf $OUT/s44-${PARTS// /-}.tar.gz -C /tmp s44; }
serve() {
  local tag=$1
  PYTHONPATH=/tmp/site:. python scripts/trace_worker.py --gpu-events --out $R/trace-$tag.json launch.py --random-weights --no-ui \
    > $R/server-$tag.txt 2>&1 &
  local pid=$!
  until curl -sf http://127.0.0.1:7860/ready > /dev/null; do kill -0 $pid 2>/dev/null || return 1; sleep 1; done
  echo "$tag ready $(date -u +%T)"
  lt() { PYTHONPATH=/tmp/site:. timeout 150 python scripts/load_test.py "$@" 2>&1 | grep -E "streams:" | sed "s/^/$tag: /"; }
  [ -e $R/warmed ] || { lt --levels 64 --requests-per-client 4 | sed "s/^/warm-up, not counted: /"; touch $R/warmed; }
  lt --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $R/http-sustained8-$tag.json
  lt --levels 1 --requests-per-client 20 --json $R/http-one-$tag.json
  kill -INT $pid; wait $pid
  echo "$tag tracebacks: $(grep -c Traceback $R/server-$tag.txt)"
  PYTHONPATH=/tmp/site:. python scripts/trace_worker.py --summary $R/trace-$tag.json \
    | grep -E "GPU with work|gpu_step|gpu_codec|gpu_prefill|deliver|job_run|batched steps|codec calls|steps/s" | sed "s/^/$tag: /"
  gzip -f $R/trace-$tag.json $R/server-$tag.txt
  pack
}
for PART in ${PARTS:?name the parts}; do
  echo "== $PART $(date -u +%T)"
  case $PART in
  tests)
    (cd $ROOT/.$FIRST && S1_FIXTURES_DIR=$ROOT/tests/fixtures PYTHONPATH=/tmp/site:. timeout ${TESTS_S:-500} python -m pytest -v \
      -p no:cacheprovider -m gpu ${TEST_FILES:-tests/test_channels_last_decoder.py tests/test_codec_stream.py \
      tests/test_engine_batching.py tests/test_codec_runner.py tests/test_gpu.py} --durations 8 2>&1 \
      | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|error|s call|s setup|Error|assert" > $R/gpu-tests.txt; tail -14 $R/gpu-tests.txt) ;;
  kernels)
    for shape in "1 4" "8 32"; do
      set -- $shape
      (cd $ROOT/.$FIRST && PYTHONPATH=/tmp/site:. timeout 200 python scripts/profile_batch.py --weights random --batches $1 --chunk $2 \
        --kv 512 --codec-kernels --json $R/kernels-$1x$2.json 2>&1 | grep -v Warn | tail -${KERNEL_LINES:-30} | sed "s/^/$1 x $2: /")
    done ;;
  codec)
    for tree in ${CODEC_TREES:-$TREES}; do
      # the parts of a call (after call 2), where the tree's script times them
      (cd $ROOT/.$tree && parts=$(grep -q -- "--parts" scripts/profile_codec_calls.py && echo "--parts ${CODEC_PARTS:-1x4,8x32,64x32}")
       PYTHONPATH=/tmp/site:. timeout 240 python scripts/profile_codec_calls.py --weights random \
        --row-buckets 1,4,8,16,32,64 $parts --json $R/codec-calls-$tree.json 2>&1 | grep -v Warn | sed "s/^/$tree: /")
    done ;;
  http)
    for tree in ${TREES}; do
      (cd $ROOT/.$tree && serve $tree)
    done ;;
  esac
  pack
done
date -u
