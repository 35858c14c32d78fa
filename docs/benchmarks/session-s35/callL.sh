# Start-up on one machine: cold, then a warm start sampled by sample_stacks.py (batch-1 graphs only); which
# cache entries each run added (Triton's in our cache dir and its default one, Inductor's).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
run() {
  env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc-l timeout 150 python "$@" --phase startup --cache-dir /tmp/cc-l \
    --weights random --device auto --precision auto --compile auto --compile-mode default --quantize none --max-batch-size 1
}
entries() { echo "triton $(ls /tmp/cc-l/compile/triton 2>/dev/null | wc -l), default triton $(ls ~/.triton/cache 2>/dev/null | wc -l), inductor files $(find /tmp/cc-l/compile/inductor -type f 2>/dev/null | wc -l)"; }
entries; ls -t ~/.triton/cache 2>/dev/null | head -3
run scripts/benchmark.py > $OUT/cold.txt 2>&1; echo "cold rc $? $(tail -1 $OUT/cold.txt | cut -c1-200)"; entries
ls /tmp/cc-l/compile/triton > /tmp/after-cold.txt; find /tmp/cc-l/compile/inductor -type f | sort > /tmp/ind-cold.txt
run docs/benchmarks/session-s35/sample_stacks.py $OUT/stacks-warm1.txt scripts/benchmark.py > $OUT/warm1.txt 2>&1
echo "warm1 rc $? $(tail -1 $OUT/warm1.txt | cut -c1-200)"; entries
ls /tmp/cc-l/compile/triton > /tmp/after-warm.txt
for d in $(comm -13 /tmp/after-cold.txt /tmp/after-warm.txt); do ls /tmp/cc-l/compile/triton/$d | grep -v json | head -2; done | sort | uniq -c | sort -rn > $OUT/new-triton.txt
find /tmp/cc-l/compile/inductor -type f | sort | comm -13 /tmp/ind-cold.txt - > $OUT/new-inductor.txt
echo "new triton kernels: $(wc -l < $OUT/new-triton.txt), new inductor files: $(wc -l < $OUT/new-inductor.txt)"; head -5 $OUT/new-triton.txt
