# Prepared for the next device session (not run): whole-k-blocks.diff and two variants, each against main (.base/).
# Set up here first (from the repository root):
#   for t in base wk wkgu wkn2; do rm -rf .$t && mkdir .$t && git archive HEAD engine scripts assets app $(git ls-files 'tests/*.py') | tar -x -C .$t; done
#   for t in wk wkgu wkn2; do (cd .$t && patch -p1 -s < ../docs/benchmarks/session-s34/whole-k-blocks.diff); done
#   sed -i 's/Launch(block_n=4, block_k=512, num_warps=8),  # gate\/up/Launch(block_n=4, block_k=1024, num_warps=8),  # gate\/up/' .wkgu/engine/model/fused_linear.py
#   sed -i 's/Launch(block_n=4, block_k=4096, num_warps=8),  # down/Launch(block_n=2, block_k=4096, num_warps=8),  # down/' .wkn2/engine/model/fused_linear.py
#   for t in s32 s128; do rm -rf .$t && cp -r .base .$t; done   # one row's keys a program, now that they load before the PDL wait
#   sed -i 's/^SPLIT_KEYS, ONE_ROW_SPLIT_KEYS, BLOCK_KEYS = 256, 64, 64/SPLIT_KEYS, ONE_ROW_SPLIT_KEYS, BLOCK_KEYS = 256, 32, 64/' .s32/engine/model/decode_attention.py
#   sed -i 's/^SPLIT_KEYS, ONE_ROW_SPLIT_KEYS, BLOCK_KEYS = 256, 64, 64/SPLIT_KEYS, ONE_ROW_SPLIT_KEYS, BLOCK_KEYS = 256, 128, 64/' .s128/engine/model/decode_attention.py
#   rm -rf .record && cp -r .base .record && (cd .record && patch -p1 -s < ../docs/benchmarks/session-s34/record-kernel.diff)
#   rm -rf .side && cp -r .base .side && (cd .side && patch -p1 -s < ../docs/benchmarks/session-s34/side-stream.diff)
#   carry: .whl .base .wk .wkgu .wkn2 (PART=1), .whl .base .s32 .s128 (PART=3), .whl .base .record (PART=5), .whl .base .side (PART=6)
# PART=1: batch-1 frames, twice each (~50 s a cold profile); PART=2: the GPU tests of the fused projections and the step;
# PART=3: one row's split of 32 or 128 keys against 64 (block_keys is min(64, split): 32 keys are one block of 32);
# PART=4: timeline_probe.py on main (where each kernel's time sits on the frame's critical path; ~60 s cold);
# PART=5: record-kernel.diff (the step's bookkeeping in one kernel) at batch 1 twice, batch 64 once; if it wins, apply
# it and run PART=2 plus tests/test_record_kernel.py tests/test_batched_step.py tests/test_engine_batching.py;
# PART=6 (run it first: the largest expected gain): side-stream.diff, codebook 0's head and sampler on a second stream
# beside fast position 0, at batch 1 twice and batch 64 once; then its GPU tests in the .side tree (tests/test_gpu.py
# compares the graphed step's codes with plain generation's, which runs on one stream).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
profile() {
  local tree=$1; shift
  (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40 "$@") > /tmp/ps.txt 2>&1
  echo "$* $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend|_fused_linear|_merge' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
}
case "${PART:-1}" in
  1) for tree in .base .wk .wkgu .wkn2 .base .wk .wkgu .wkn2; do profile $tree; done ;;
  6) for tree in .base .side .base .side; do profile $tree; done
     for tree in .base .side; do profile $tree --batch 64 --kv 512; done
     (cd .side && timeout 280 python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider) > $OUT/tests-side.txt 2>&1
     echo "side GPU tests rc $? $(tail -1 $OUT/tests-side.txt)" ;;
  5) for tree in .base .record .base .record; do profile $tree; done
     for tree in .base .record; do profile $tree --batch 64 --kv 512; done ;;
  4) timeout 300 python docs/benchmarks/session-s34/timeline_probe.py --frames 100 --json $OUT/timeline.json 2>&1 | grep -v -i warn | tail -25 ;;
  3) for tree in .base .s32 .s128 .base .s32 .s128; do profile $tree; done ;;
  2) timeout 500 python -m pytest -m gpu tests/test_decode_attention.py tests/test_fused_linear.py tests/test_gpu.py -q -p no:cacheprovider > $OUT/tests-gpu.txt 2>&1
     echo "GPU tests rc $? $(tail -1 $OUT/tests-gpu.txt)" ;;
esac
date -u
