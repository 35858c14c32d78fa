python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
for cfg in "on on" "off on" "on off" "off off" "on on"; do
  set -- $cfg
  timeout 150 python scripts/profile_step.py --weights random --frames 20 --batch 64 --kv 1024 --pdl $1 --fused-projections $2 \
    --json $OUT/ps64-kv1024-pdl$1-fp$2.json > $OUT/ps64-kv1024-pdl$1-fp$2.txt 2>&1
  echo "pdl $1 fused $2: $(grep graphed $OUT/ps64-kv1024-pdl$1-fp$2.txt)"
done
date -u
