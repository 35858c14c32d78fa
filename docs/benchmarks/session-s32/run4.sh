# Run 4 (session 32, main): the batch-64 step (kv 512: rows at 256-296 positions) with decode_attention's settings replaced; Inductor's caches off (the op's settings are not in its key)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
i=0
for v in "" "SPLIT_KEYS=128" "SPLIT_KEYS=64" "BLOCK_KEYS=32 NUM_STAGES=3" "NUM_WARPS=8 BLOCK_KEYS=128"; do
  i=$((i+1))
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 110 python docs/benchmarks/session-s31/profile_with_attention.py $v --weights random --frames 40 --batch 64 --kv 512 > $OUT/ps-$i.txt 2>&1
  echo "$i [$v] rc $? $(grep graphed $OUT/ps-$i.txt | cut -d';' -f1) | $(grep -E '_attend_split|_merge_splits' $OUT/ps-$i.txt | tr -s ' ' | cut -d' ' -f2-4 | tr '\n' ';')"
done | tee $OUT/summary.txt
date -u
