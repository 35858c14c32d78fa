python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
for kv in 512 1024; do
  timeout 150 python scripts/profile_step.py --weights random --frames 20 --batch 64 --kv $kv --json $OUT/ps64-kv$kv.json > $OUT/ps64-kv$kv.txt 2>&1
  grep graphed $OUT/ps64-kv$kv.txt
done
timeout 200 python scripts/bench_decode_attention.py --cases 64:512:half,64:1024:random --json $OUT/bda.json 2>&1 | grep -v Warn | tail -14
date -u
