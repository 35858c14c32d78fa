# Session s36, call 3: the fix for call 2's crash (the codec's spare row, reset at every replay since
# this call's tree), checked under the same sustained load; then the GPU tests it and session s35's
# unrun edits touch. carry: .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
python launch.py --random-weights --no-ui > $OUT/server.txt 2>&1 &
PID=$!
for i in $(seq 1 200); do curl -sf http://127.0.0.1:7860/ready > /dev/null && break; kill -0 $PID 2>/dev/null || break; sleep 1; done
all_ready() { curl -sf http://127.0.0.1:7860/ready | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["slots_ready"] < d["slots"] or d["capturing"])'; }
for j in $(seq 1 120); do all_ready && break; sleep 1; done
echo "ready ${i}s, every graph ${j}s more"; date -u
for run in first repeat repeat2; do
  timeout 60 python scripts/load_test.py --levels 64 --requests-per-client 1 --json $OUT/load-$run.json 2>&1 | grep streams
done
timeout 100 python scripts/load_test.py --levels 64 --requests-per-client 12 --json $OUT/load-sustained12.json 2>&1 | grep streams
timeout 40 python scripts/load_test.py --levels 1 --requests-per-client 20 --json $OUT/load-one.json 2>&1 | grep streams
curl -sf http://127.0.0.1:7860/ready; echo
kill -INT $PID; wait $PID; echo "server exit $?"
date -u
timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/test_compilation.py tests/test_record_kernel.py \
  tests/test_sampling_kernel.py tests/test_decode_attention.py "tests/test_gpu.py::test_padded_codec_replays_keep_the_spare_rows_position_bounded" \
  "tests/test_gpu.py::test_graphed_batched_codec_decodes_each_stream_like_a_lone_decoder" tests/test_fused_linear.py 2>&1 | grep -v -i warn | tail -15
date -u
