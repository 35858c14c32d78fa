"""tools/trace_worker.py: a script run under it leaves the GPU worker's spans and a summary of them."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_an_in_process_load_test_under_the_tracer_leaves_its_worker_spans(tmp_path):
    trace = tmp_path / "trace.json"
    run = subprocess.run(
        [sys.executable, "tools/trace_worker.py", "--out", str(trace), "scripts/load_test.py", "--in-process",
         "--weights", "demo", "--cache-dir", str(tmp_path / "cache"), "--levels", "2", "--requests-per-client", "1",
         "--max-new-tokens", "8", "--reference-seconds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    spans = json.loads(trace.read_text())
    names = {span[0] for span in spans}
    assert {"job_submit", "job_run", "iterate", "admit", "step", "prefill_many", "codec_submit", "deliver",
            "start", "retire"} <= names
    for name, thread, start, end, _, _ in spans:
        assert 0 <= start <= end
        if name in ("iterate", "step", "admit"):
            assert thread == "s1-gpu-worker"
    # the engine's warm-up request, the load test's 4 warm-up ones and the level's 2, each prepared once
    assert sum(span[0] == "request_prepare" for span in spans) == 1 + 4 + 2
    assert any(span[0] == "gc" for span in spans)
    summary = subprocess.run([sys.executable, "tools/trace_worker.py", "--summary", str(trace)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "iterate" in summary.stdout and "longest iterations while sequences ran" in summary.stdout
    assert "a slot empty from a retirement to the next start there" in summary.stdout
    packed = tmp_path / "trace.json.gz"  # as large traces are kept
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    from_packed = subprocess.run([sys.executable, "tools/trace_worker.py", "--summary", str(packed)],
                                 cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert from_packed.returncode == 0 and from_packed.stdout == summary.stdout


def test_a_trace_named_gz_is_written_compressed_and_read_back(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import trace_worker

    recorder = trace_worker.Recorder()
    recorder.spans = [["step", "s1-gpu-worker", 0.5, 0.6, 64, None]]
    packed = tmp_path / "trace.json.gz"
    recorder.write(packed)
    assert json.loads(gzip.decompress(packed.read_bytes())) == recorder.spans
    with trace_worker.open_trace(packed, "rt") as f:
        assert json.load(f) == recorder.spans


def test_the_summary_finds_bursts_and_their_first_admission_and_longest_prefill():
    sys.path.insert(0, str(ROOT / "tools"))
    import trace_worker

    spans = [["request_prepare", "t", 10.0 + 0.01 * i, 10.0 + 0.01 * i + 0.002, None, None] for i in range(20)]
    spans += [["request_prepare", "t", 20.0, 20.001, None, None]]  # a lone request: no burst
    spans += [["admit", "s1-gpu-worker", 10.05, 10.06, [0, 5, 0], [0, 5, 1]],  # deferred: nobody admitted
              ["admit", "s1-gpu-worker", 10.10, 10.40, [0, 9, 0], [1, 8, 0]],
              ["prefill", "s1-gpu-worker", 10.10, 10.40, None, None],
              ["job_run", "s1-gpu-worker", 10.02, 10.045, None, None],
              ["gc", "s1-gpu-worker", 10.5, 10.502, 2, 0]]
    assert trace_worker.bursts(spans) == [(10.0, spans[19][2], 20)]
    summary = trace_worker.summarise(spans)
    assert ("burst at 10.00 s: 20 requests over 190 ms; first admission 100 ms after the first request; "
            "longest prefill call 300 ms; longest job (a request's set-up) 25 ms; longest collection 2.0 ms") in summary
    # two admissions of 10 and 300 ms: the percentiles the nearest rank below, the p99 not under the p50
    assert f"{'admit':20s} {2:7d} {10.0:8.2f} {10.0:8.2f} {300.0:9.1f} {0.31:8.2f}" in summary.splitlines()


def test_the_summary_says_how_full_the_steps_and_codec_calls_were_and_how_long_slots_stood_empty():
    sys.path.insert(0, str(ROOT / "tools"))
    import trace_worker

    spans = [["admit", "w", 1.0, 1.001, [2, 0, 0], [2, 0, 0]], ["step", "w", 1.001, 1.002, 2, 2],
             ["retire", "w", 1.003, 1.004, [0], [0]],
             ["admit", "w", 1.01, 1.011, [3, 2, 0], [3, 2, 0]], ["step", "w", 1.011, 1.012, 4, 4],
             ["start", "w", 1.054, 1.055, [[0, 11], [3, 12]], [[0, 11], [3, 12]]],
             ["codec_submit", "w", 1.02, 1.021, 3, 3], ["codec_submit", "w", 1.03, 1.031, 1, 1]]
    lines = trace_worker.load_lines(spans)
    assert "steps: 2 with sequences, 3.0 rows on average, 4 at most" in lines
    # 4 slots (the most rows seen): 2 free with none waiting, then 1 free while 2 waited
    assert "free slots per iteration (of 4, the most rows seen): 0.50 while requests waited, 1.00 while none did" in lines
    assert "a slot empty from a retirement to the next start there: 1 times, p50 50 ms, p90 50 ms" in lines
    # the codec's row buckets for 4 slots are 1, 2, 3 and 4 (codec_row_buckets): no call is padded
    assert "codec calls: 2, 2.0 rows on average (4 rows, 4 with their buckets' padding)" in lines
    assert [s[2] for s in trace_worker.within(spans, 1.01, 1.03)] == [1.01, 1.011, 1.02, 1.03]


def test_the_summary_says_how_fast_steps_came_and_where_a_slots_turnover_went():
    sys.path.insert(0, str(ROOT / "tools"))
    import trace_worker

    spans = [["step", "w", 1.0, 1.001, 2, 2], ["step", "w", 1.5, 1.501, 2, 2], ["step", "w", 2.0, 2.001, 0, 0],
             ["frame_counts_wait", "w", 1.1, 1.11, None, None], ["frame_counts_wait", "w", 1.13, 1.14, None, None],
             ["frame_counts_wait", "w", 1.19, 1.2, None, None], ["frame_counts_wait", "w", 1.3, 1.31, None, None],
             # request 7 reaches the worker 40 ms after slot 0 emptied and starts there 100 ms later
             ["retire", "w", 1.2, 1.21, [0], [0]], ["job_run", "w", 1.25, 1.26, 7, 7],
             ["start", "w", 1.35, 1.351, [[0, 7]], [[0, 7]]],
             # request 8 was taken before slot 1 emptied: all of that slot's empty time is its own wait
             ["job_run", "w", 1.0, 1.01, 8, 8], ["retire", "w", 1.05, 1.1, [1, 3], [1, 3]],
             ["start", "w", 1.3, 1.301, [[1, 8]], [[1, 8]]],
             # request 9: 20 ms after slot 3 emptied (retired with slot 1), started 50 ms later
             ["job_run", "w", 1.12, 1.13, 9, 9], ["start", "w", 1.17, 1.171, [[3, 9]], [[3, 9]]],
             # request 7's next text chunk, and a sequence of no known request: not a request's first start
             ["retire", "w", 1.5, 1.51, [2], [2]], ["start", "w", 1.6, 1.601, [[2, 7], [4, None]], [[2, 7], [4, None]]]]
    lines = trace_worker.pace_lines(spans)
    assert "batched steps: 2 a second" in lines  # two steps with rows, 0.5 s apart
    # 20, 50 and 100 ms (the nearest rank below, as the other percentiles here)
    assert "host work between two frame-count read-backs: p50 50.0 ms, p90 50.0 ms" in lines
    # from the worker taking each request to its start: 100, 300 and 50 ms
    assert ("a request from the worker taking it to its first start in a slot (its clips' encodes, admission, "
            "prefill): p50 100 ms, p90 100 ms") in lines
    # slot 0: 40 ms then 100 ms; slot 1: 0 then 200 ms; slot 3: 20 then 50 ms
    assert ("a slot's empty time until the worker took its next request (the last audio, the client's turn): "
            "p50 20 ms, p90 20 ms; from then to its start: p50 100 ms, p90 100 ms") in lines


def test_the_summary_times_a_sequences_last_audio_from_its_retirement():
    sys.path.insert(0, str(ROOT / "tools"))
    import trace_worker

    spans = [["start", "w", 1.0, 1.001, [[0, 7], [1, 8]], None],
             ["deliver", "w", 1.2, 1.201, [7, 4, False], None],  # a first hand-out: not the last audio
             ["retire", "w", 1.3, 1.31, [0, 1], None],
             ["deliver", "w", 1.33, 1.331, [8, 12, True], None],  # 20 ms after its retirement
             ["deliver", "w", 1.35, 1.351, [7, 20, True], None],  # 40 ms: both percentiles the nearest rank below
             ["deliver", "w", 1.4, 1.401, [9, 3, True], None]]  # a request that never started in the trace
    lines = trace_worker.pace_lines(spans)
    assert "a sequence's retirement to its last audio handed to its request: p50 20 ms, p90 20 ms" in lines


def test_the_gpu_summary_gives_the_union_of_the_gpu_spans_and_its_idle_gaps():
    sys.path.insert(0, str(ROOT / "tools"))
    import trace_worker

    spans = [["gpu_step", "gpu", 1.000, 1.004, [64, 512], None],
             ["gpu_codec", "gpu", 1.002, 1.010, [8, 32], None],  # overlaps the step: counted once
             ["gpu_step", "gpu", 1.012, 1.016, [64, 512], None],  # after a 2 ms gap
             ["gpu_codec", "gpu", 1.0164, 1.020, [4, 4], None],  # after a 0.4 ms gap
             ["gpu_encode", "gpu", 1.001, 1.003, [3, 215], None],  # inside the others
             ["gpu_encode", "gpu", 1.005, 1.009, [1, 215], None],
             ["step", "s1-gpu-worker", 0.5, 0.6, 64, 64]]  # a host span: not the GPU's
    lines = trace_worker.gpu_lines(spans)
    # busy 10 + 4 + 3.6 ms of 20
    assert lines[0] == "GPU with work: 88.0% of 0.02 s; idle 0.002 s in 2 gaps (1 over 1 ms, longest 2.0 ms)"
    assert "gpu_step: 2 spans, p50 4.00 ms" in lines
    assert "gpu_codec, 4 frames: 1 calls of 4.0 rows, span p50 3.60 ms" in lines
    assert "gpu_codec, 32 frames: 1 calls of 8.0 rows, span p50 8.00 ms" in lines
    assert "gpu_encode, 1 clips: 1 passes, span p50 4.0 ms, p90 4.0 ms" in lines
    assert "gpu_encode, 3 clips: 1 passes, span p50 2.0 ms, p90 2.0 ms" in lines
    assert "the codec's stream with a call: 58.0% of the time" in lines  # 8 + 3.6 ms of 20
    assert trace_worker.gpu_lines(spans[-1:]) == []


def test_gpu_events_without_cuda_leave_the_calls_alone(monkeypatch):
    sys.path.insert(0, str(ROOT / "tools"))
    import torch

    import trace_worker

    class Part:
        def work(self, x):
            return x + 1

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recorder = trace_worker.Recorder(gpu_events=True)
    recorder.gpu.time_method(Part, "work", "gpu_work", lambda s, a: a[0])
    assert Part().work(1) == 2
    assert recorder.gpu.calls == [] and recorder.gpu.spans() == []


@pytest.mark.gpu
def test_gpu_events_bracket_the_steps_and_codec_calls_of_an_in_process_load_test(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    trace = tmp_path / "trace.json"
    run = subprocess.run(
        [sys.executable, "tools/trace_worker.py", "--gpu-events", "--out", str(trace), "scripts/load_test.py",
         "--in-process", "--weights", "demo", "--cache-dir", str(tmp_path / "cache"), "--levels", "2",
         "--requests-per-client", "1", "--max-new-tokens", "8", "--reference-seconds", "1",
         # Two slots are all a level of 2 needs; fp32 as the other demo engines of the GPU tests,
         # whose compiled kernels the shared compile cache then holds.
         "--engine-option", "max_batch_size=2", "--engine-option", "precision=fp32"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    spans = json.loads(trace.read_text())
    gpu = [s for s in spans if s[1] == "gpu"]
    assert {"gpu_step", "gpu_codec", "gpu_prefill", "gpu_encode"} <= {s[0] for s in gpu}  # the warm-up's clip
    host_steps = [s for s in spans if s[0] == "step"]
    for name, _, start, end, _, _ in gpu:
        assert 0 <= start <= end
    # The clocks agree to well under a millisecond: the first step's GPU work ends after the host
    # queued it, and before the host's first read-back of frame counts (of that step or a later one) returned.
    first_host, first_gpu = min(s[2] for s in host_steps), min(s[3] for s in gpu if s[0] == "gpu_step")
    first_read_back = min(s[3] for s in spans if s[0] == "frame_counts_wait")
    assert first_host - 1e-3 < first_gpu < first_read_back + 1e-3
    sys.path.insert(0, str(ROOT / "tools"))
    import trace_worker

    busy = trace_worker.gpu_lines(spans)[0]
    assert busy.startswith("GPU with work: ")
    assert 0 < float(busy.split(":")[1].split("%")[0]) <= 100
