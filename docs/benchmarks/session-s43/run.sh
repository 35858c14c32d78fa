# Session s43's device calls: the channels-last codec decoder (branch conv-cl) against main. Several parts
# per call (PARTS), results packed after every part (a call cut short still brings back what it finished).
# Set S1_COMMIT by hand (the device's copy of the repository has a stale HEAD). The base tree, main at
# 1213308, in a folder .git/info/exclude ignores, carried with the call (and .cl1 the same way, the branch
# at ac75acd, before the smaller tiles for small calls; .m2 main at 3ea75ab, before the feeds):
#   rm -rf .base && mkdir .base && git archive 1213308 engine scripts assets app pytest.ini launch.py | tar -x -C .base
# Parts:
#   cltests:  the GPU tests of the channels-last decoder and of codec streaming
#   alltests: the engine's GPU tests (test_gpu.py, test_engine_batching.py, test_codec_runner.py)
#   codec:    scripts/profile_codec_calls.py per tree in TREES (a codec call's fixed and per-row cost)
#   bench:    scripts/bench_conv_kernel.py at 1 row x 4 frames, 8 and 64 rows x 32 frames
#   kernels:  the codec's kernels by GPU time, one row x 4 frames and 8 rows x 32 frames (profile_batch)
#   http:     one server per tree in TREES: the sustained mix twice (64 clients x 8), one stream's first audio
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:?set S1_COMMIT to the commit under test}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
R=/tmp/s43; mkdir -p $R
ROOT=$PWD
dir_of() { case $1 in cl) echo $ROOT ;; *) echo $ROOT/.$1 ;; esac; }
pack() { tar -czf $OUT/s43-${PARTS// /-}.tar.gz -C /tmp s43; }
# serve TAG: a server of the tree in the current directory under trace_worker --gpu-events; a warm-up level
# on a fresh machine (not counted), the sustained mix twice (64 clients x 8), one stream's first audio.
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
    | grep -E "GPU with work|gpu_step|gpu_codec|batched steps|codec calls|steps/s" | sed "s/^/$tag: /"
  gzip -f $R/trace-$tag.json $R/server-$tag.txt
  pack
}
for PART in ${PARTS:?name the parts}; do
  echo "== $PART $(date -u +%T)"
  case $PART in
  cltests)
    S1_FIXTURES_DIR=$ROOT/tests/fixtures PYTHONPATH=/tmp/site:. timeout 300 python -m pytest -q -p no:cacheprovider -m gpu \
      tests/test_channels_last_decoder.py tests/test_codec_stream.py 2>&1 | tail -15 | tee $R/cl-tests.txt ;;
  alltests)
    S1_FIXTURES_DIR=$ROOT/tests/fixtures PYTHONPATH=/tmp/site:. timeout ${TESTS_S:-500} python -m pytest -v -p no:cacheprovider \
      -m gpu ${TEST_FILES:-tests/test_gpu.py tests/test_engine_batching.py tests/test_codec_runner.py} --durations 8 2>&1 \
      | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|s call|s setup|Error" > $R/gpu-tests.txt; tail -14 $R/gpu-tests.txt ;;
  codec)
    for tree in ${TREES:-base cl}; do
      (cd $(dir_of $tree) && PYTHONPATH=/tmp/site:. timeout 240 python scripts/profile_codec_calls.py --weights random \
        --row-buckets 1,4,8,16,32,64 --json $R/codec-calls-$tree.json 2>&1 | grep -v Warn | sed "s/^/$tree: /")
    done ;;
  bench)
    # BENCH_TILES (after call 8): "large" also times every size with conv_kernel.large_tiles;
    # BENCH_TREES (after call 10): the trees to bench, one after the other
    for tree in ${BENCH_TREES:-cl}; do
      for shape in ${BENCH_SHAPES:-"1 4" "8 32" "64 32"}; do
        set -- $shape
        (cd $(dir_of $tree) && PYTHONPATH=/tmp/site:. timeout 120 python scripts/bench_conv_kernel.py --rows $1 --frames $2 \
          --pieces --json $R/bench-$tree-$1x$2.json 2>&1 | grep -v Warn | sed "s/^/$tree $1 x $2: /" | tee -a $R/bench.txt \
          | grep total)
        [ "$BENCH_TILES" = large ] && (cd $(dir_of $tree) && PYTHONPATH=/tmp/site:. timeout 120 python scripts/bench_conv_kernel.py \
          --rows $1 --frames $2 --large-tiles --json $R/bench-$tree-$1x$2-large.json 2>&1 | grep total | sed "s/^/$tree $1 x $2 large tiles: /")
      done
    done ;;
  kernels)
    for shape in "1 4" "8 32"; do
      set -- $shape
      PYTHONPATH=/tmp/site:. timeout 200 python scripts/profile_batch.py --weights random --batches $1 --chunk $2 --kv 512 \
        --codec-kernels --json $R/kernels-$1x$2.json 2>&1 | grep -v Warn | tail -18 | sed "s/^/$1 x $2: /"
    done ;;
  http)
    for tree in ${TREES:-base cl}; do
      (cd $(dir_of $tree) && serve $tree)
    done ;;
  esac
  pack
done
date -u
