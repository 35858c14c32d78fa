# Run 6 (session 31, main 6b8df69): one stream through the engine, then start-up (cold, warm, warm) with every graph (--max-batch-size 0)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 250 python scripts/benchmark.py --weights random --max-batch-size 1 --concurrency "" --runs 3 --requests 3 --skip-startup \
  --json $OUT/b1.json > $OUT/b1.txt 2>&1; echo "bench rc $?"; grep -v -i warn $OUT/b1.txt | tail -22
for run in cold warm warm; do
  env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout 200 python scripts/benchmark.py --phase startup --cache-dir /tmp/cc \
    --weights random --device auto --precision auto --compile auto --compile-mode default --quantize none --max-batch-size 0 > $OUT/startup-$run.txt 2>&1
  echo "$run rc $?"; tail -1 $OUT/startup-$run.txt | cut -c1-600
done
date -u
