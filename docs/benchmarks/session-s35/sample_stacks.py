"""Poor man's sampling profiler for benchmark.py's start-up phase: every 10 ms, the innermost frames
of every thread's stack (cProfile sees only the main thread; the engine prepares on its own thread).
Usage: python sample_stacks.py OUT.txt scripts/benchmark.py --phase startup ...  (argv as for the script)."""
import collections
import os
import runpy
import sys
import threading
import time
import traceback

out_path, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
counts: collections.Counter = collections.Counter()
stop = threading.Event()


def sample() -> None:
    me = threading.get_ident()
    while not stop.wait(0.01):
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack = traceback.extract_stack(frame)
            counts[tuple(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}:{f.name}" for f in reversed(stack))] += 1


sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
sys.argv = [script, *args]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script` would
started = time.perf_counter()
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit:
    pass
finally:
    stop.set()
    sampler.join()
    by_function: collections.Counter = collections.Counter()
    for stack, n in counts.items():
        for part in set(stack):  # inclusive time of each frame
            by_function[part] += n
    with open(out_path, "w") as f:
        f.write(f"wall {time.perf_counter() - started:.1f} s, samples every 10 ms\n\n# inclusive, top 120\n")
        for part, n in by_function.most_common(120):
            f.write(f"{n * 0.01:7.2f} s  {part}\n")
        f.write("\n# innermost stacks, top 60\n")
        innermost: collections.Counter = collections.Counter()
        for stack, n in counts.items():
            innermost[" <- ".join(stack[:14])] += n
        for stack, n in innermost.most_common(60):
            f.write(f"{n * 0.01:7.2f} s  {stack}\n")
