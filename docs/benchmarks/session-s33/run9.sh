# Run 9 (session 33): the attention kernel requests its first block of cached keys before the query math and uses the new key and value
# from registers (main's tree) against b4f5d44 (.base/): attention GPU tests, batch-1 frames and batch-64 steps alternating, then tests/test_gpu.py.
# (run 8's script, profiling the attention kernel instead of the merge; .base/ at b4f5d44)
KERNEL=_attend_split bash docs/benchmarks/session-s33/run8.sh
