python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
cd .fp8
echo "== bf16 cache"; timeout 120 python kv_layout.py bf16 $OUT/bf16 2>&1 | grep -v Warn
echo "== fp8 cache, bf16 dots"; timeout 120 python kv_layout.py fp8 $OUT/fp8 2>&1 | grep -v Warn
echo "== fp8 cache, fp16 dots"; KV_F16=1 timeout 120 python kv_layout.py fp8 $OUT/fp8f16 2>&1 | grep -v Warn
python - <<'PY'
import torch, glob, os
out = os.environ["OUT"]
for f in sorted(glob.glob(f"{out}/fp8-*.pt")):
    a = torch.load(f); b = torch.load(f.replace("/fp8-", "/fp8f16-")); c = torch.load(f.replace("/fp8-", "/bf16-"))
    print(os.path.basename(f), "fp16-dots vs bf16-dots max", (a - b).abs().max().item(), "rel", ((a-b).norm()/a.norm()).item(),
          "| fp8 vs bf16 cache rel", ((a-c).norm()/c.norm()).item())
PY
for kv in fp8 fp8; do KV_F16=1 timeout 150 python scripts/profile_step.py --weights random --frames 20 --batch 64 --kv 1024 --kv-cache $kv > $OUT/ps-f16-$kv.txt 2>&1; echo "KV_F16 step kv_cache=$kv: $(grep graphed $OUT/ps-f16-$kv.txt)"; done
timeout 150 python scripts/profile_step.py --weights random --frames 20 --batch 64 --kv 1024 > $OUT/ps-auto.txt 2>&1; echo "step auto: $(grep graphed $OUT/ps-auto.txt)"
date -u
