# Session s36, call 4: call 3 again with the reset capturable (index_fill_, no host scalar): the GPU
# tests first, then the server under the sustained load that crashed call 2. carry: .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_compilation.py tests/test_record_kernel.py \
  tests/test_sampling_kernel.py tests/test_decode_attention.py "tests/test_gpu.py::test_padded_codec_replays_keep_the_spare_rows_position_bounded" \
  "tests/test_gpu.py::test_graphed_batched_codec_decodes_each_stream_like_a_lone_decoder" tests/test_fused_linear.py 2>&1 | grep -v -i warn | tail -6
date -u
python launch.py --random-weights --no-ui > $OUT/server.txt 2>&1 &
PID=$!
for i in $(seq 1 150); do curl -sf http://127.0.0.1:7860/ready > /dev/null && break; kill -0 $PID 2>/dev/null || break; sleep 1; done
all_ready() { curl -sf http://127.0.0.1:7860/ready | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["slots_ready"] < d["slots"] or d["capturing"])' 2>/dev/null; }
for j in $(seq 1 90); do all_ready && break; kill -0 $PID 2>/dev/null || break; sleep 1; done
echo "ready ${i}s, every graph ${j}s more"; date -u
for run in first repeat; do
  timeout 40 python scripts/load_test.py --levels 64 --requests-per-client 1 --json $OUT/load-$run.json 2>&1 | grep streams
done
timeout 80 python scripts/load_test.py --levels 64 --requests-per-client 12 --json $OUT/load-sustained12.json 2>&1 | grep streams
timeout 30 python scripts/load_test.py --levels 1 --requests-per-client 15 --json $OUT/load-one.json 2>&1 | grep streams
curl -s http://127.0.0.1:7860/ready; echo
kill -INT $PID; wait $PID; echo "server exit $?"
date -u
