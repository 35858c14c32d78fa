# Run 4 (session 31): sweep fused_linear launch settings with and without early_launch, then the batch-1 frame with each table
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 240 python scripts/bench_fused_linear.py --json $OUT/bfl.json > $OUT/bfl.txt 2>&1; echo "bfl rc $?"; grep -v Warn $OUT/bfl.txt | tail -6
for kind in none plain early best none plain early best; do
  timeout 100 python docs/benchmarks/session-s31/profile_with_table.py $OUT/bfl.json $kind --weights random --frames 40 > $OUT/ps-$kind.txt 2>&1
  echo "$kind rc $? $(grep graphed $OUT/ps-$kind.txt)"
done
timeout 100 python docs/benchmarks/session-s31/profile_with_table.py $OUT/bfl.json best --weights random --frames 40 --json $OUT/ps-best.json > /dev/null 2>&1; echo "best json rc $?"
grep table $OUT/ps-*.txt | sort -u
date -u
