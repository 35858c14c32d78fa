# Session s37, call 8: the codec batcher (blocks and last frames wait up to 8 steps for company; last
# chunks share the graph they are padded to). Its GPU tests, then in process against codec_hold_steps 0
# in the same tree: the sustained cached mix (64 clients x 8) and bursts of 64. carry: .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 S1_COMMIT=${S1_COMMIT:-}
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/test_engine_batching.py \
  "tests/test_gpu.py::test_graphed_batched_codec_decodes_each_stream_like_a_lone_decoder" \
  "tests/test_gpu.py::test_padded_codec_replays_keep_the_spare_rows_position_bounded" > $OUT/gpu-tests.txt 2>&1
echo "GPU tests rc $? $(tail -1 $OUT/gpu-tests.txt)"
lt() { timeout 150 python scripts/load_test.py --in-process --weights random "$@" 2>&1 | grep -E "streams:|Error|error:"; }
for hold in 8 0; do
  echo "hold $hold sustained"; lt --codec-hold-steps $hold --levels 64,64 --requests-per-client 8 --distinct-clips 21 --json $OUT/sustained-hold$hold.json
done
for hold in 8 0; do
  echo "hold $hold bursts"; lt --codec-hold-steps $hold --levels 64,64,64 --requests-per-client 1 --distinct-clips 21 --json $OUT/bursts-hold$hold.json
done
date -u
