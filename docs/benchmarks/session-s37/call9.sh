# Session s37, call 9: last chunks sharing their padded graph length (main at this call) against main
# before it (cfedb76), trees alternating, in process: the sustained cached mix (64 clients x 8) and
# bursts of 64. Trees .base (git archive cfedb76) and .grp (HEAD); carry: .whl .base .grp
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
lt() { timeout 110 python scripts/load_test.py --in-process --weights random "$@" 2>&1 | grep -E "streams:|Error|error:"; }
for kind in sustained bursts; do
  for tree in base grp; do
    if [ $kind = sustained ]; then args="--levels 64,64 --requests-per-client 8"; else args="--levels 64,64,64 --requests-per-client 1"; fi
    echo "$tree $kind"; (cd .$tree && lt $args --distinct-clips 21 --json $OUT/$kind-$tree.json)
  done
done
date -u
