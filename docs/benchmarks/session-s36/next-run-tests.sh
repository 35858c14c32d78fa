# Prepared for the next device session (not run): the GPU tests, in calls of their own (test_gpu.py
# alone takes ~200 s on a warm machine; calls 2 and 4 of session s36 cut them at 300 and 150 s).
#   PART=1: the codec's spare-row fix (the two codec tests of test_gpu.py), session s35's unrun edits
#           (test_compilation's warm start; launch_options in the four Triton kernels' tests)
#   PART=2: the rest of test_gpu.py (the graphed encoder, captured on its replay stream since s36),
#           then the engine-batching GPU tests (the 1,000-request soak now checks the spare row)
# carry: .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
gpu_tests() { timeout 540 python -m pytest -q -m gpu -p no:cacheprovider --durations=10 "$@" 2>&1 | grep -v -i warn | tail -30; }
if [ "${PART:-1}" = 1 ]; then
  gpu_tests "tests/test_gpu.py::test_padded_codec_replays_keep_the_spare_rows_position_bounded" \
    "tests/test_gpu.py::test_graphed_batched_codec_decodes_each_stream_like_a_lone_decoder" \
    tests/test_compilation.py tests/test_record_kernel.py tests/test_sampling_kernel.py tests/test_decode_attention.py \
    tests/test_fused_linear.py
else
  gpu_tests tests/test_gpu.py tests/test_engine_batching.py
fi
date -u
