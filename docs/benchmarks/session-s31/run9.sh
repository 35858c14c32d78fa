# Run 9 (session 31, main; run 8 again with Inductor's caches off: run 8's variants all hit the cached graph of the first): the batch-1 frame with decode_attention's warps, stages and one-row split replaced;
# then the attention and graphed-step GPU tests with the fastest replacement
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
i=0
for v in "" "NUM_WARPS=2" "ONE_ROW_SPLIT_KEYS=128" "ONE_ROW_SPLIT_KEYS=32" ""; do
  i=$((i+1))
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 80 python docs/benchmarks/session-s31/profile_with_attention.py $v --weights random --frames 40 > $OUT/ps-$i.txt 2>&1
  echo "$i [$v] rc $? $(grep graphed $OUT/ps-$i.txt | cut -d';' -f1) | $(grep -E '_attend_split|_merge_splits' $OUT/ps-$i.txt | tr -s ' ' | cut -d' ' -f2-4 | tr '\n' ';')"
done | tee $OUT/summary.txt
best=$(python3 - <<'PY'
import re
rows = [l for l in open("/root/out/summary.txt".replace("/root/out", __import__("os").environ["OUT"])) if "graphed" in l]
ms = [(float(re.search(r"graphed: ([\d.]+) ms", l).group(1)), re.search(r"\[(.*?)\]", l).group(1)) for l in rows]
print(min(ms)[1])
PY
)
echo "fastest: [$best]"
if [ -n "$best" ]; then
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 ATTN_OVERRIDES="$best" PYTHONPATH=$PYTHONPATH:docs/benchmarks/session-s31 timeout 200 python -m pytest -p attn_plugin -m gpu \
    tests/test_decode_attention.py tests/test_gpu.py -k "attention or attend or graphed or alone or logits_close" -q -p no:cacheprovider > $OUT/gpu-tests.txt 2>&1
  echo "tests rc $?"; grep -E "overrides|passed|failed" $OUT/gpu-tests.txt | tail -3
fi
date -u
