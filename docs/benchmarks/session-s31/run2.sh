# Run 2 (session 31): fused_linear launch settings in the frame's chains (chain_bench.py), then main's GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 240 python docs/benchmarks/session-s31/chain_bench.py $OUT/chain.json > $OUT/chain.txt 2>&1; echo "chain rc $?"
grep -v Warn $OUT/chain.txt | tail -40
timeout 300 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -x > $OUT/gpu-tests.txt 2>&1; echo "tests rc $?"
tail -3 $OUT/gpu-tests.txt; date -u
