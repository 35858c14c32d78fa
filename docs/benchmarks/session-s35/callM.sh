# Start-up with every graph (--max-batch-size 0), as call D: cold, then warm, fresh folders; which Triton
# kernels the warm start added to the cache (none expected with the pinned ptxas).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
run() {
  env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc-m timeout 200 python scripts/benchmark.py --phase startup --cache-dir /tmp/cc-m \
    --weights random --device auto --precision auto --compile auto --compile-mode default --quantize none --max-batch-size 0
}
run > $OUT/cold.txt 2>&1; echo "cold rc $? $(tail -1 $OUT/cold.txt | cut -c1-420)"; ls /tmp/cc-m/compile/triton > /tmp/after-cold.txt
run > $OUT/warm.txt 2>&1; echo "warm rc $? $(tail -1 $OUT/warm.txt | cut -c1-420)"; ls /tmp/cc-m/compile/triton > /tmp/after-warm.txt
echo "Triton kernels: $(wc -l < /tmp/after-cold.txt) after cold, $(comm -13 /tmp/after-cold.txt /tmp/after-warm.txt | wc -l) new after warm"
