# Run 8 (session 31, main): the batch-1 frame with decode_attention's warps, stages and one-row split replaced
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
i=0
for v in "" "NUM_WARPS=2" "NUM_WARPS=1" "NUM_STAGES=1" "ONE_ROW_SPLIT_KEYS=32" "ONE_ROW_SPLIT_KEYS=128" "" "NUM_WARPS=2"; do
  i=$((i+1))
  timeout 90 python docs/benchmarks/session-s31/profile_with_attention.py $v --weights random --frames 40 > $OUT/ps-$i.txt 2>&1
  echo "$i [$v] rc $? $(grep graphed $OUT/ps-$i.txt) | $(grep -E '_attend_split|_merge_splits' $OUT/ps-$i.txt | tr -s ' ' | tr '\n' ';')"
done
date -u
