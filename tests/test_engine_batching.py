"""Many requests at once through the engine (demo model, CPU): concurrency, cancellation, no leaks."""

import gc
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from engine.facade import ReferenceInput, TTSEngine
from engine.params import SamplingParams
from engine.runtime import worker as worker_module
from engine.runtime.scheduler import BLOCK_SIZES
from engine.runtime.worker import Job
from engine.text.splitter import split_text
from engine.core import RequestRun
from tests.waiting import wait_until


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def engine(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    # fp32 on the GPU too: in bf16 the batch-1 graph's single-row kernels and the GEMMs of larger
    # batches round differently, and a seeded request's codes can part ways after some frames
    # (the multi-chunk test below, in bf16, from the fourth frame of one request).
    engine = TTSEngine.from_config(EngineConfig(demo=True, device=request.param, precision="fp32", max_batch_size=8,
                                                max_queue=64, cache_dir=str(root / "cache"),
                                                voices_dir=str(root / "voices")))
    engine.warmup()
    engine.capture_all()  # on CUDA: every batch's graphs, before the leak test measures memory
    yield engine
    engine.close()


def allocated(engine) -> int:
    return torch.cuda.memory_allocated() if engine.models.placement.device.type == "cuda" else 0


def wait_idle(engine, timeout=30.0):
    synth = engine._core
    # Cancelled requests are finished at once, but audio already being decoded for them is still
    # delivered (and dropped): wait for the codec too.
    wait_until(lambda: not (engine._worker.in_flight or synth.scheduler.busy or synth.codec_runner.pending),
               "the engine idle", timeout, detail=lambda: f"engine stats: {engine.stats()}")


def reference_clip(seconds=1.0):
    t = np.arange(int(44100 * seconds)) / 44100
    return ReferenceInput((44100, (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32)), "A short clip.")


def test_concurrent_requests_get_their_own_audio(engine):
    """The same seeded request gives the same audio alone and among seven others."""
    params = [SamplingParams(max_new_tokens=6 + i, seed=100 + i) for i in range(8)]
    texts = [f"Concurrent request number {i}." for i in range(8)]
    alone = [engine.synthesize(t, params=p).audio for t, p in zip(texts, params)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: engine.synthesize(texts[i], params=params[i]).audio, range(8)))
    for a, b in zip(alone, together):
        assert a.shape == b.shape
        # Same frames, same codec chunks; batched convolutions may round differently on a GPU.
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)


def test_multi_chunk_requests_with_voices_get_their_own_audio_while_queued_and_batched(engine):
    """Texts of one to five chunks (each next chunk re-enters the queue at its front, voiced by
    the first chunk's codes), a third with a reference voice, more requests than slots: each
    request's audio is what it gets alone."""
    rng = random.Random(0)
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
    voice = reference_clip()
    requests = []
    for i in range(12):
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(rng.randint(1, 5))]
        params = SamplingParams(max_new_tokens=rng.randint(6, 20), seed=i, chunk_length=100)
        requests.append((". ".join(sentences) + ".", [voice] if i % 3 == 0 else [], params))

    def run(request):
        text, refs, params = request
        return engine.synthesize(text, references=refs, params=params).audio

    chunks = [len(split_text(text, params.chunk_length)) for text, _, params in requests]
    assert max(chunks) >= 3 and chunks.count(1) >= 2  # long and short requests mixed
    alone = [run(r) for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(run, requests))
    assert sum(len(a) for a in alone) > 0
    # On a GPU the audio differs by up to ~0.01 with the codes the same (cuDNN runs fp32
    # convolutions in TF32 by default, with algorithms that depend on the batch); one different
    # code moves its frame's samples by ~0.1-1.
    atol = 0.02 if engine.models.placement.device.type == "cuda" else 1e-4
    for a, b in zip(alone, together):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def test_a_first_chunk_without_frames_leaves_the_next_chunks_unvoiced(engine, monkeypatch):
    """Found on the GPU, where the demo model may end a chunk at once: the next chunk took the first
    chunk's zero frames as its voice and the whole request failed."""
    harvested = RequestRun.harvested
    monkeypatch.setattr(RequestRun, "harvested", lambda self, codes: harvested(self, codes[:, :0]))
    text = ("The first sentence of this request is here, and it goes on for quite a while longer. "
            "And a second one follows it right after, which is also long enough to stand alone.")
    params = SamplingParams(max_new_tokens=6, seed=1, chunk_length=100)
    assert len(split_text(text, params.chunk_length)) == 2
    assert engine.synthesize(text, params=params).stats["frames"] > 0


def test_no_slot_or_memory_leak_after_1000_requests_with_cancellations(engine):
    rng = random.Random(0)
    plan = [(rng.random(), rng.randint(2, 10)) for _ in range(1000)]
    voice = reference_clip()
    outcomes = {"complete": 0, "cancelled": 0}

    def probe():
        """Audio of fixed seeded requests, alone: the same before and after the storm, unless state leaked."""
        return [engine.synthesize(f"Probe {s}, still there?", params=SamplingParams(max_new_tokens=6, seed=s)).audio
                for s in range(12)]

    probe_before = probe()
    assert any(len(audio) for audio in probe_before), "the demo model ended every probe at once: pick other probes"
    wait_idle(engine)
    before = allocated(engine)

    def one(i):
        draw, frames = plan[i]
        refs = [voice] if i % 3 == 0 else []  # a third share one voice: prefix cache hits and evictions
        stream = engine.synthesize_stream(f"Request {i} speaks.", references=refs,
                                          params=SamplingParams(max_new_tokens=frames, seed=i))
        if draw < 0.3:  # the client goes away after its first audio
            next(stream, None)  # (the demo model may end at once, without audio)
            stream.close()
            return "cancelled"
        list(stream)  # the demo model may end at once: a complete request can be silent
        return "complete"

    with ThreadPoolExecutor(24) as pool:
        for outcome in pool.map(one, range(len(plan))):
            outcomes[outcome] += 1
    wait_idle(engine)
    assert outcomes["cancelled"] > 200 and outcomes["complete"] > 600
    scheduler = engine._core.scheduler
    assert scheduler.free_slots == engine.slots and scheduler.running == scheduler.waiting == 0
    assert int(engine._core.runner.state.active.sum()) == 0
    # With CUDA graphs, a padded codec replay advances the spare row: each replay resets it, or it
    # would run past the RoPE table (a device assert that kills the process).
    codec = engine._core.codec_runner
    assert int(codec.decoder.positions[codec.rows]) <= max(BLOCK_SIZES)
    prefix = engine._core.prefix_cache
    assert prefix.hits > 100 and prefix.bytes <= prefix.max_bytes
    stats = engine.stats()
    assert stats["running"] == 0 and stats["queue_depth"] == 0
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, (RequestRun, Job))]
    # GPU memory: what grew is the prefix cache (bounded) and allocator rounding, nothing per request.
    assert allocated(engine) - before <= prefix.bytes + 64 * 2**20
    # And it still serves: the probes give the audio they gave before.
    for old, new in zip(probe_before, probe()):
        assert old.shape == new.shape
        np.testing.assert_allclose(old, new, rtol=0, atol=1e-4)


def assert_a_request_fails_with_it_and_the_engine_carries_on(engine, message):
    """A short request meets the failure the test set up: it ends with that error rather than wait
    forever, and the engine serves the next ones."""
    outcome = []

    def request():
        try:
            engine.synthesize("This one meets the failure.", params=SamplingParams(max_new_tokens=4, seed=3))
        except Exception as exc:
            outcome.append(exc)

    caller = threading.Thread(target=request, daemon=True)  # a daemon: a hang fails the test, not the run
    caller.start()
    caller.join(timeout=60)
    assert not caller.is_alive(), "the request never ended"
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError) and message in str(outcome[0])
    wait_idle(engine)
    assert any(len(engine.synthesize("After it.", params=SamplingParams(max_new_tokens=4, seed=s)).audio)
               for s in range(20))


def test_a_failed_codec_call_fails_its_requests_and_the_engine_carries_on(engine, monkeypatch):
    """The failing call holds the request's last frames (budget 4 = the first hand-out): the request
    has already left the scheduler, and must still get the error rather than wait forever."""
    runner = engine._core.codec_runner
    real_submit = runner.submit

    def broken(harvests):
        monkeypatch.setattr(runner, "submit", real_submit)  # only the first call breaks
        raise RuntimeError("codec broke")

    monkeypatch.setattr(runner, "submit", broken)
    assert_a_request_fails_with_it_and_the_engine_carries_on(engine, "codec broke")


def test_a_codec_call_failing_at_its_read_back_fails_its_requests_and_the_engine_carries_on(engine, monkeypatch):
    """Reading a decode's audio back can fail too (e.g. a CUDA error surfacing at its event): the
    requests whose audio it held get the error rather than wait forever."""
    runner = engine._core.codec_runner
    real_completed = runner.completed

    def broken(wait=False):
        if not runner.pending:
            return real_completed(wait)
        monkeypatch.setattr(runner, "completed", real_completed)  # only the first read-back breaks
        raise RuntimeError("read-back broke")

    monkeypatch.setattr(runner, "completed", broken)
    assert_a_request_fails_with_it_and_the_engine_carries_on(engine, "read-back broke")


def test_step_and_codec_graphs_replaying_at_once_give_the_codec_audio_of_serial_replays(engine):
    """The decode step's graphs and the codec's replay at the same time, on two streams. Each set is
    captured on a stream of its own: a graph keeps the cuBLAS workspace of the stream it was
    captured on, and with one shared capture stream the two sets race on it (a server crashes at
    64 streams: an illegal instruction, or a segfault in replay)."""
    if engine.models.placement.device.type != "cuda":
        pytest.skip("CUDA graphs run on CUDA only")
    synth = engine._core
    runner, codec = synth.runner, synth.codec_runner
    capture_streams = [runner._capture_stream, codec.stream]
    assert None not in capture_streams and capture_streams[0] != capture_streams[1]
    step = runner._graphs[(max(runner.batch_buckets), max(runner.kv_buckets))]
    chunk = codec._graphs[(max(codec.row_buckets), max(n for _, n in codec._graphs))]

    def replay(concurrently: bool) -> torch.Tensor:
        codec.decoder.reset()
        torch.cuda.synchronize()
        for _ in range(5):
            codec.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(codec.stream):
                chunk.graph.replay()
            if not concurrently:
                torch.cuda.synchronize()
            step.replay()
        torch.cuda.synchronize()
        return chunk.audio.clone()

    def compare():
        np.testing.assert_array_equal(replay(False).cpu().numpy(), replay(True).cpu().numpy())
        runner.state.positions.zero_()  # idle rows stood still; nothing else to undo

    def request():
        return engine.synthesize("Still serving the same audio.", params=SamplingParams(max_new_tokens=12, seed=1)).audio

    before = request()
    engine._worker.call(compare)
    wait_idle(engine)
    np.testing.assert_array_equal(request(), before)  # the replays left nothing behind


HOLD_S = 60  # a bound on waits for events that come at once: reached only when the engine is broken


@contextmanager
def arriving_together(engine, monkeypatch, jobs: int):
    """Holds the GPU worker on a job of its own until `jobs` more jobs are submitted, whichever
    threads submit them and however slowly: it then runs them all in one round, before the step
    that follows it (GPUWorker._run_round), as if they had arrived at the same instant."""
    submit, lock, submitted, all_submitted = engine._worker.submit, threading.Lock(), [], threading.Event()

    def counted_submit(work):
        job = submit(work)
        with lock:
            submitted.append(job)
            if len(submitted) == jobs:
                all_submitted.set()
        return job

    holding = threading.Event()

    def hold(job):
        holding.set()
        job.emit(all_submitted.wait(HOLD_S))
        job.finish()

    held = submit(hold)
    # The hold runs before anything else is queued, so its round ends with it and the jobs wait behind.
    assert holding.wait(HOLD_S), "the GPU worker did not run the holding job"
    monkeypatch.setattr(engine._worker, "submit", counted_submit)
    try:
        yield
    finally:
        monkeypatch.setattr(engine._worker, "submit", submit)
    assert next(held.results()), f"{len(submitted)} of {jobs} jobs reached the GPU worker while it was held"


@pytest.mark.gpu
def test_a_new_engine_captures_larger_batches_when_demanded_or_idle(tmp_path, monkeypatch):
    """Ready with batch 1's graphs alone: four requests arriving together drain the batch, the
    graphs up to four rows are captured, and each request gets the audio it gets alone; the last
    bucket (8) is captured once the worker is idle. The reference encoder's graphs come with the
    first new clip that finds no sequence running; one that comes while sequences run encodes
    eagerly, with the codes the graphs give it. With decode_priority on: the worker thread's stream
    outranks the codec's; with encode_priority on (the default) the reference encoder's stream ranks
    as the worker's."""
    monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 1e6)  # no idle capture until the test allows it
    engine = TTSEngine.from_config(EngineConfig(demo=True, device="cuda", precision="fp32", max_batch_size=8,
                                                cache_dir=str(tmp_path / "cache"), voices_dir=str(tmp_path / "voices"),
                                                decode_priority=True))
    try:
        synth = engine._core
        worker_priority = engine._worker.call(lambda: torch.cuda.current_stream().priority)
        assert worker_priority < synth.codec_runner.stream.priority
        assert synth.clip_encodes.encoder._stream.priority == worker_priority
        engine.warmup()
        assert synth.runner._capture_stream.priority == worker_priority  # the step graphs rank as the worker
        assert engine.stats()["slots_ready"] == 1 and engine.capturing
        encoder = synth.reference_encoder
        assert not encoder.captured
        clip, other_clip = reference_clip(1.5).audio[1], reference_clip(0.7).audio[1]
        with monkeypatch.context() as running:  # as while sequences run: the clip encodes eagerly
            running.setattr(type(synth.scheduler), "drained", property(lambda self: False))
            eager_codes = engine.encode_codes((44100, clip))
        assert not encoder.captured
        engine.encode_codes((44100, other_clip))  # nothing runs: the encoder's graphs first
        assert encoder.captured
        np.testing.assert_array_equal(engine._worker.call(lambda: encoder.encode(clip)).numpy(), eager_codes)
        params = [SamplingParams(max_new_tokens=6 + i, seed=200 + i) for i in range(4)]
        texts = [f"Request {i} of a fresh engine." for i in range(4)]
        alone = [engine.synthesize(t, params=p).audio for t, p in zip(texts, params)]
        assert engine.stats()["slots_ready"] == 1
        with arriving_together(engine, monkeypatch, 4), ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda i: engine.synthesize(texts[i], params=params[i]).audio, range(4)))
        assert engine.stats()["slots_ready"] == 4
        for a, b in zip(alone, together):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
        graphs, all_captured = synth.graphs, threading.Event()
        capture_more = graphs.capture_more

        def capture_more_then_tell(up_to: int = 0, encodes_idle: bool = True) -> bool:
            remaining = capture_more(up_to, encodes_idle)
            if not remaining:
                all_captured.set()
            return remaining

        monkeypatch.setattr(graphs, "capture_more", capture_more_then_tell)
        monkeypatch.setattr(worker_module, "IDLE_AFTER_S", 0.1)
        engine._worker.call(lambda: None)  # wakes the worker, which then waits the new quiet time
        assert all_captured.wait(300), "the idle worker did not capture batch 8"
        assert engine.stats()["slots_ready"] == 8 and not engine.capturing
        np.testing.assert_allclose(engine.synthesize(texts[0], params=params[0]).audio, alone[0], rtol=0, atol=1e-4)
    finally:
        engine.close()
