# Run 7 (session 31): cold compile of every graph (--max-batch-size 0), main (6b8df69) and d58d597 (.base2/, before the position-0 trim), one machine, fresh caches each, main, d58d597, main
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u
for tree in . .base2 .; do
  tag=$(basename $(cd $tree && pwd)); [ "$tree" = . ] && tag=main
  d=$(mktemp -d)
  (cd $tree && env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$d/pyc timeout 170 python scripts/benchmark.py --phase startup --cache-dir $d/cc \
    --weights random --device auto --precision auto --compile auto --compile-mode default --quantize none --max-batch-size 0) > $OUT/cold-$tag.txt 2>&1
  echo "$tag rc $? $(tail -1 $OUT/cold-$tag.txt | cut -c1-420)"
done
date -u
