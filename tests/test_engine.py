"""TTSEngine end to end on CPU: demo weights and a checkpoint assembled from the tiny fixtures."""

import math
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from audio_samples import SpeechClips
from engine.config import EngineConfig
from engine.errors import CheckpointError, DeviceError, InputError, VoiceNotFoundError
from engine.facade import ReferenceInput, TTSEngine
from engine.params import SamplingParams
from engine.runtime.reference_encoder import EncodeHandle
from engine.text.splitter import split_text
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
FAST = SamplingParams(max_new_tokens=12, seed=7)


def assemble_checkpoint(s1_dir: Path, codec_dir: Path, target: Path) -> Path:
    """A checkpoint directory in the released layout, with the tiny codec's config beside codec.pth."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.pth", "tokenizer.tiktoken", "special_tokens.json"):
        shutil.copy(s1_dir / name, target / name)
    shutil.copy(codec_dir / "codec.pth", target / "codec.pth")
    shutil.copy(codec_dir / "config.json", target / "codec_config.json")
    return target


@pytest.fixture(scope="module")
def tiny_checkpoint(s1_dir, codec_dir, tmp_path_factory):
    return assemble_checkpoint(s1_dir, codec_dir, tmp_path_factory.mktemp("ckpt") / "s1-tiny")


def demo_engine(tmp_path, **options):
    """A demo engine of its own, caching into tmp_path."""
    return TTSEngine.from_config(EngineConfig(demo=True, cache_dir=str(tmp_path / "cache"),
                                              voices_dir=str(tmp_path / "voices"), **options))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = demo_engine(tmp_path_factory.mktemp("engine"), max_text_length=500)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    return SpeechClips(tmp_path_factory.mktemp("speech"))


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def frames_reported(stdout: str) -> int:
    return int(stdout.split(" frames in ")[0].rsplit(" ", 1)[-1])


@pytest.mark.parametrize("source", ["demo", "checkpoint"])
def test_cli_synth_writes_44k_wav_of_expected_length(source, tiny_checkpoint, tmp_path):
    out = tmp_path / "out.wav"
    where = ["--demo"] if source == "demo" else ["--checkpoint", str(tiny_checkpoint)]
    result = run_cli("synth", *where, "--text", "Hello world. This is a test.", "--out", str(out),
                     "--seed", "1", "--max-new-tokens", "20")
    assert result.returncode == 0, result.stderr
    audio, rate = sf.read(out)
    assert rate == 44100
    frames = frames_reported(result.stdout)
    assert 0 < frames <= 20
    assert len(audio) == frames * 2048
    assert np.abs(audio).max() > 0.01


def test_cli_voice_clone_with_reference_file(tiny_checkpoint, speech, tmp_path):
    out = tmp_path / "clone.wav"
    result = run_cli("synth", "--checkpoint", str(tiny_checkpoint), "--text", "Now in the cloned voice.",
                     "--reference", str(speech.wav()), "--reference-text", "The quick brown fox jumps over the lazy dog.",
                     "--out", str(out), "--seed", "2", "--max-new-tokens", "16")
    assert result.returncode == 0, result.stderr
    audio, rate = sf.read(out)
    assert rate == 44100 and len(audio) == frames_reported(result.stdout) * 2048 > 0


def test_cli_errors_are_clear(tmp_path):
    result = run_cli("synth", "--demo", "--text", "   ", "--out", str(tmp_path / "x.wav"))
    assert result.returncode == 2 and "text is empty" in result.stderr
    result = run_cli("synth", "--demo", "--text", "hi", "--reference", "a.wav", "--out", str(tmp_path / "x.wav"))
    assert result.returncode == 2 and "--reference-text" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_tokenize_prints_json_lines(s1_dir, s1_expected):
    texts = s1_expected["tokenizer_texts"][:3]
    result = run_cli("tokenize", "--checkpoint", str(s1_dir), *texts)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [eval(line) for line in lines] == s1_expected["tokenizer_ids"][:3]


def test_same_seed_same_audio_and_other_seed_differs(engine):
    first = engine.synthesize("Seeded sampling.", params=FAST)
    again = engine.synthesize("Seeded sampling.", params=FAST)
    other = engine.synthesize("Seeded sampling.", params=SamplingParams(max_new_tokens=12, seed=8))
    assert np.array_equal(first.audio, again.audio)
    assert first.audio.shape != other.audio.shape or not np.array_equal(first.audio, other.audio)
    assert first.stats["frames"] * 2048 == len(first.audio)
    assert first.stats["ttfa_s"] <= first.stats["total_s"]


def test_a_request_reports_how_long_each_stage_took(engine):
    from engine.facade import TIMELINE_STAGES, request_timeline

    result = engine.synthesize("Timed stages.", params=FAST)
    timeline = result.stats["timeline_ms"]
    assert list(timeline) == list(TIMELINE_STAGES) and all(ms >= 0 for ms in timeline.values())
    after_submit = sum(ms for stage, ms in timeline.items() if stage != "prepared")
    assert after_submit == pytest.approx(result.stats["ttfa_s"] * 1000)
    # Stages a request never reached are left out; each is timed from the last one it reached.
    assert request_timeline(1.0, 1.5, {"started": 2.0, "voice_ready": 4.0}, None) == {
        "prepared": 500.0, "started": 500.0, "voice_ready": 2000.0}


def test_a_stream_has_its_stages_until_the_first_audio_when_that_audio_comes(engine):
    """So that a server can say where the time went in the headers it sends with the first audio."""
    from engine.facade import TIMELINE_STAGES

    stats: dict = {}
    params = SamplingParams(max_new_tokens=12, seed=5, chunk_length=100)
    chunks = engine.synthesize_stream("Timed stages, one after another. " * 8, params=params, stats=stats)
    next(chunks)
    first = dict(stats["timeline_ms"])
    assert list(first) == list(TIMELINE_STAGES) and "total_s" not in stats
    assert sum(ms for stage, ms in first.items() if stage != "prepared") == pytest.approx(stats["ttfa_s"] * 1000)
    list(chunks)
    assert stats["timeline_ms"] == first and "total_s" in stats


def test_stream_yields_the_same_audio_as_synthesize(engine):
    text = "First sentence here. " * 8 + "And a last one."
    params = SamplingParams(max_new_tokens=10, seed=3, chunk_length=100)
    chunks = list(engine.synthesize_stream(text, params=params))
    whole = engine.synthesize(text, params=params)
    assert len(chunks) > 1
    assert np.array_equal(np.concatenate(chunks), whole.audio)


def run_core(engine, text, params):
    """AudioChunks straight from the engine core (the facade hides text-chunk boundaries)."""
    request = engine._prepare(text, (), None, params)
    return list(engine._worker.submit(lambda job: engine._core.start(request, job)).results())


def test_long_text_chunks_join_without_clicks(engine):
    text = " ".join(f"Sentence number {i} is here." for i in range(15))
    chunks = run_core(engine, text, SamplingParams(max_new_tokens=8, seed=5, chunk_length=100))
    by_text_chunk = {}
    for chunk in chunks:
        by_text_chunk.setdefault(chunk.text_chunk, []).append(chunk.samples)
    audio = [np.concatenate(parts) for _, parts in sorted(by_text_chunk.items())]
    assert len(audio) >= 3
    for left, right in zip(audio, audio[1:]):
        # Both sides of a seam fade to silence, so the jump across it is tiny.
        assert abs(float(left[-1])) < 1e-3 and abs(float(right[0])) < 1e-3
        assert np.abs(left[-2000:-500]).max() > 0.01  # the fade is short; the audio before it is not silenced


def test_streamed_audio_equals_a_whole_decode_of_the_same_codes(engine, monkeypatch):
    decoded = []
    decoder = engine._core.codec_runner.decoder
    real_decode = decoder.decode
    monkeypatch.setattr(decoder, "decode", lambda codes, rows: decoded.append(codes) or real_decode(codes, rows))
    chunks = run_core(engine, "One single chunk of text.", SamplingParams(max_new_tokens=40, seed=9))
    streamed = np.concatenate([c.samples for c in chunks])
    assert len(decoded) > 1  # it really streamed in several blocks
    with torch.inference_mode():
        whole = engine.models.codec.decode(torch.cat(decoded, dim=-1))[0, 0].numpy()
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() < 1e-4


def test_later_chunks_reuse_the_first_chunks_voice(engine, monkeypatch):
    from engine import voice_prompts
    from engine.runtime.scheduler import Scheduler

    voices, specs = [], []
    real_prefix, real_submit = voice_prompts.voice_prefix, Scheduler.submit

    def spy_prefix(tokenizer, references, num_codebooks):
        voices.append([(t, c.clone()) for t, c in references])
        return real_prefix(tokenizer, references, num_codebooks)

    def spy_submit(scheduler, spec, owner, *, front=False):
        specs.append(spec)
        return real_submit(scheduler, spec, owner, front=front)

    monkeypatch.setattr(voice_prompts, "voice_prefix", spy_prefix)
    monkeypatch.setattr(Scheduler, "submit", spy_submit)
    text = "The first part of the story is told here. " * 5 + "Then the second part follows after it."
    engine.synthesize(text, params=SamplingParams(max_new_tokens=10, seed=11, chunk_length=100))
    chunks = split_text(text, 100)
    assert len(chunks) >= 3 and len(specs) == len(chunks)
    assert specs[0].prefix_length == 1  # unvoiced: <|interleave|> alone
    built = [refs for refs in voices if refs]
    assert len(built) == 1 and len(built[0]) == 1 and built[0][0][0] == chunks[0]  # chunk 0's text and its codes
    tokenizer = engine.models.tokenizer
    voice = real_prefix(tokenizer, built[0], engine.models.model.config.num_codebooks)
    for spec in specs[1:]:
        assert spec.prefix_length == voice.shape[1] and spec.prefix_key == specs[1].prefix_key
        assert torch.equal(spec.prompt[:, :voice.shape[1]].cpu().long(), voice.long())


def test_voice_prompts_are_kept_by_clip_and_transcript_up_to_a_bound(engine):
    from engine.request import ReferenceClip
    from engine.voice_prompts import VoicePromptCache, voice_prefix

    num_codebooks = engine.models.model.config.num_codebooks
    prompts, samples = VoicePromptCache(engine.models.tokenizer, num_codebooks, kept=2), np.zeros(10, dtype=np.float32)
    codes = [torch.zeros(num_codebooks, 5, dtype=torch.long)]
    clips = [[ReferenceClip(samples, f"Transcript {i}.", "same-clip-key")] for i in range(3)]
    assert prompts.get(clips[0]) is None  # not built yet
    first = prompts.get(clips[0], codes)
    assert torch.equal(first[0], voice_prefix(engine.models.tokenizer, [("Transcript 0.", codes[0])], num_codebooks))
    assert prompts.get(clips[0]) is first
    assert prompts.get(clips[1], codes)[1] != first[1]  # another transcript, another prompt
    prompts.get(clips[2], codes)
    assert prompts.get(clips[0]) is None and prompts.get(clips[2]) is not None  # oldest evicted


def test_voice_clone_and_saved_voice(engine, speech):
    transcript = "The quick brown fox jumps over the lazy dog. This is a short reference clip."
    ref = ReferenceInput(speech.wav().read_bytes(), transcript)
    before, decoded_before = engine.reference_cache.stats(), engine._decoded_clips.hits
    cloned = engine.synthesize("Cloned.", references=[ref], params=FAST)
    assert len(cloned.audio) > 0
    after = engine.reference_cache.stats()
    assert after["misses"] == before["misses"] + 1 and after["items"] == before["items"] + 1  # encoded, kept
    engine.synthesize("Cloned again.", references=[ref], params=FAST)  # the voice's prompt was kept: no lookup
    again = engine.reference_cache.stats()
    assert again["misses"] == after["misses"] and again["memory_hits"] == after["memory_hits"]
    assert engine._decoded_clips.hits == decoded_before + 1  # the same bytes again: not decoded again
    retold = ReferenceInput(ref.audio, transcript + " Told again.")  # another prompt, the clip's codes kept
    engine.synthesize("Cloned once more.", references=[retold], params=FAST)
    last = engine.reference_cache.stats()
    assert last["misses"] == after["misses"] and last["memory_hits"] == after["memory_hits"] + 1
    assert not engine._core.clip_encodes._encoding and engine.in_flight == 0

    engine.voices.add("fox", speech.variant("flac"), transcript)
    saved = engine.synthesize("Saved voice.", voice="fox", params=FAST)
    assert len(saved.audio) > 0
    hits = engine._decoded_clips.hits
    engine.synthesize("Saved voice again.", voice="fox", params=FAST)
    assert engine._decoded_clips.hits == hits + 1  # the voice's file unchanged: not decoded again


@pytest.mark.parametrize("exact", [False, True])
def test_only_exact_sampling_keeps_the_vocabulary_wide_output_matrix(exact, tmp_path):
    engine = demo_engine(tmp_path, device="cpu", exact_sampling=exact)
    try:
        model = engine.models.model
        assert (model.output is not None) == exact
        if not exact:
            with pytest.raises(RuntimeError, match="exact_sampling=True"):
                model.slow_logits(torch.zeros(1, 1, model.config.dim))
        result = engine.synthesize("Both heads speak.", params=SamplingParams(max_new_tokens=6, seed=0))
        assert result.audio.dtype == np.float32 and np.isfinite(result.audio).all()
    finally:
        engine.close()


def test_batch_reports_errors_per_item(engine):
    progress = []
    results = engine.synthesize_batch(["One.", "   ", "Three."], params=FAST,
                                      progress=lambda done, total: progress.append((done, total)))
    assert isinstance(results[1], InputError)
    assert results[0].audio.size > 0 and results[2].audio.size > 0
    assert progress == [(1, 3), (2, 3), (3, 3)]


# ---- bad input: each answered with a clear error, and the engine keeps working ----------------------


def silent_wav(tmp_path: Path, seconds: float = 2.0) -> Path:
    path = tmp_path / "silent.wav"
    sf.write(path, np.zeros(int(44100 * seconds), dtype=np.float32), 44100)
    return path


@pytest.mark.parametrize("make_reference, message", [
    (lambda tmp, speech: ReferenceInput(b"not audio at all", "words"), "cannot"),
    (lambda tmp, speech: ReferenceInput(b"", "words"), "empty"),
    (lambda tmp, speech: ReferenceInput(silent_wav(tmp), "words"), "silent"),
    (lambda tmp, speech: ReferenceInput((44100, np.full(44100, np.nan, dtype=np.float32)), "words"), "NaN"),
    (lambda tmp, speech: ReferenceInput((44100, np.random.default_rng(0).uniform(-0.5, 0.5, 44100 * 100)
                                         .astype(np.float32)), "words"), "long"),
    (lambda tmp, speech: ReferenceInput(speech.wav(), "   "), "transcript"),
    (lambda tmp, speech: ReferenceInput(tmp / "missing.wav", "words"), "missing.wav"),
])
def test_bad_reference_is_rejected_clearly(engine, speech, tmp_path, make_reference, message):
    with pytest.raises(InputError) as err:
        engine.synthesize("Hello.", references=[make_reference(tmp_path, speech)], params=FAST)
    assert message.lower() in str(err.value).lower()
    assert len(engine.synthesize("Still working.", params=FAST).audio) > 0


@pytest.mark.parametrize("text, message", [("", "empty"), ("  \n\t ", "empty"), ("\u200b\ufeff \u2060", "empty"),
                                           ("x" * 501, "limit")])
def test_bad_text_is_rejected_clearly(engine, text, message):
    with pytest.raises(InputError, match=message):
        engine.synthesize(text, params=FAST)


def test_unknown_voice_is_rejected_clearly(engine):
    with pytest.raises(VoiceNotFoundError, match="nobody"):
        engine.synthesize("Hello.", voice="nobody", params=FAST)


@pytest.mark.parametrize("field, value", [
    ("temperature", 0.0), ("temperature", 1.5), ("top_p", 0.05), ("top_p", math.nan),
    ("repetition_penalty", 0.5), ("repetition_penalty", 2.5), ("max_new_tokens", -1),
    ("max_new_tokens", 1.5), ("chunk_length", 10), ("seed", -3), ("temperature", "hot"),
])
def test_sampling_parameters_out_of_range(field, value):
    with pytest.raises(InputError, match=field):
        SamplingParams(**{field: value})


# ---- checkpoints -----------------------------------------------------------------------------------


def test_wrong_shape_checkpoint_names_the_keys(tiny_checkpoint, tmp_path):
    import json

    broken = shutil.copytree(tiny_checkpoint, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] += 8
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"feed_forward\.w1\.weight"):
        TTSEngine.from_config(EngineConfig(checkpoint=str(broken)))


def test_missing_and_corrupt_files_are_explained(tiny_checkpoint, tmp_path):
    partial = shutil.copytree(tiny_checkpoint, tmp_path / "partial")
    (partial / "codec.pth").unlink()
    with pytest.raises(CheckpointError, match="codec.pth") as err:
        TTSEngine.from_config(EngineConfig(checkpoint=str(partial)))
    assert "--demo" in str(err.value)

    corrupt = shutil.copytree(tiny_checkpoint, tmp_path / "corrupt")
    (corrupt / "model.pth").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="download it again"):
        TTSEngine.from_config(EngineConfig(checkpoint=str(corrupt)))


def test_repo_id_without_network_explains_how_to_get_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no ./checkpoints/openaudio-s1-mini here
    with pytest.raises(CheckpointError) as err:
        TTSEngine.from_config(EngineConfig())
    message = str(err.value)
    assert "fishaudio/openaudio-s1-mini" in message and "HF_TOKEN" in message and "--demo" in message


def test_int8_engine_speaks_and_gpu_only_quantization_is_refused_on_cpu(tmp_path):
    eng = demo_engine(tmp_path, quantize="int8", device="cpu")
    try:
        result = eng.synthesize("Quantized weights.", params=FAST)
        assert 0 < result.stats["frames"] and len(result.audio) == result.stats["frames"] * 2048
    finally:
        eng.close()
    with pytest.raises(DeviceError, match="--quantize int4 is unavailable on cpu"):
        TTSEngine.from_config(EngineConfig(demo=True, quantize="int4", device="cpu"))


@pytest.mark.parametrize("failing", ["step", "codec"])
def test_a_failed_batch_capture_is_logged_and_the_engine_serves_on(failing, tmp_path, monkeypatch):
    """Larger batch graphs are captured after start-up; if a capture fails, capturing stops and the
    batches whose step and codec graphs both exist keep serving. (On a CPU there are no graphs: the
    runner is staged with batch 1 captured and batch 2 to capture.)"""
    from engine.runtime.step_runner import StepRunner

    engine = demo_engine(tmp_path)
    try:
        core = engine._core
        runner = core.runner
        runner.ready_slots = 1
        monkeypatch.setattr(StepRunner, "pending_batches", property(lambda self: [] if self.capture_stopped else [2]))

        def fail(*args):
            raise RuntimeError("capture failed")

        def step_captured(batches):
            runner.ready_slots = 2  # a step capture (not reached: the codec's comes first and fails)
            return 0.0

        monkeypatch.setattr(runner, "prepare", fail if failing == "step" else step_captured)
        monkeypatch.setattr(core.codec_runner, "prepare", fail if failing == "codec" else lambda batches: 0.0)
        engine.capture_all(timeout_s=30)
        assert runner.capture_stopped and not engine.capturing
        assert runner.ready_slots == engine.slots_ready == 1 and not core.scheduler.needs_capture
        with ThreadPoolExecutor(3) as pool:  # more requests than batch 1: they take turns
            results = list(pool.map(lambda s: engine.synthesize("Still serving.", params=SamplingParams(
                max_new_tokens=8, seed=s)), range(3)))
        assert all(r.audio.dtype == np.float32 for r in results)
    finally:
        engine.close()


class HeldEncode:
    """Stands in for a CUDA event: an encode that finishes when the test releases it."""

    def __init__(self, released):
        self.released = released

    def query(self) -> bool:
        return self.released.is_set()

    def synchronize(self) -> None:
        assert self.released.is_set(), "the worker waited on an encode still running"


def hold_encodes(eng, monkeypatch, fail_on: int = 0):
    """Reference encodes give their real codes only once the returned event is set, and batch
    number `fail_on` (1-based; 0: none) raises as it starts; returns (that event, the sample counts
    of each batch started)."""
    encoder = eng._core.clip_encodes.encoder
    real_start, released, starts = encoder.start, threading.Event(), []

    def start(clips):
        starts.append([len(samples) for samples in clips])
        if len(starts) == fail_on:
            raise RuntimeError("encoder out of order")
        return [EncodeHandle(handle.result(), HeldEncode(released)) for handle in real_start(clips)]

    monkeypatch.setattr(encoder, "start", start)
    return released, starts


def in_background(fn, *args, **kwargs) -> Future:
    """fn(*args, **kwargs) on a daemon thread: a call that hangs cannot hold the test process at exit."""
    future = Future()

    def run():
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


def worker_iterations(eng, count: int = 2) -> None:
    """Return once the GPU worker has run at least `count - 1` whole iterations of its loop: each job
    runs after the loop's iteration that follows the job before it."""
    for _ in range(count):
        eng._worker.call(lambda: None)


def test_the_engine_sets_the_gil_switch_interval_its_config_names(tmp_path):
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        eng = demo_engine(tmp_path, switch_interval_ms=0.25)
        eng.close()
        assert sys.getswitchinterval() == pytest.approx(0.00025)
        eng = demo_engine(tmp_path, switch_interval_ms=0)
        eng.close()
        assert sys.getswitchinterval() == pytest.approx(0.00025)  # 0: left as it was
    finally:
        sys.setswitchinterval(before)


@pytest.fixture
def fresh_engine(tmp_path):
    eng = demo_engine(tmp_path)
    yield eng
    eng.close()


def test_requests_run_while_a_new_voice_encodes_and_one_encode_serves_every_request_for_it(fresh_engine, speech,
                                                                                            monkeypatch):
    eng = fresh_engine
    released, starts = hold_encodes(eng, monkeypatch)
    ref = ReferenceInput(speech.wav().read_bytes(), "The quick brown fox.")
    voiced = [in_background(eng.synthesize, f"Voiced {i}.", references=[ref], params=FAST) for i in range(2)]
    wait_until(lambda: starts, "the clip's encode started")
    unvoiced = eng.synthesize("No voice meanwhile.", params=FAST)  # not held up by the encode
    assert len(unvoiced.audio) > 0 and not any(f.done() for f in voiced)
    released.set()
    results = [f.result(timeout=120) for f in voiced]
    assert starts == [starts[0]] and all(len(r.audio) > 0 for r in results)
    assert eng.reference_cache.stats()["misses"] == 1
    assert eng.synthesize("Voiced again.", references=[ref], params=FAST).audio.size and len(starts) == 1


def test_codes_asked_for_alone_wait_beside_the_running_requests_and_share_the_clips_encode(fresh_engine, speech,
                                                                                            monkeypatch):
    """encode_codes (/v1/vqgan/encode) waits for its clip off the GPU worker, which goes on running
    requests; a request bringing the same clip meanwhile shares its one encode."""
    eng = fresh_engine
    released, starts = hold_encodes(eng, monkeypatch)
    wav = speech.wav().read_bytes()
    codes = in_background(eng.encode_codes, wav)
    wait_until(lambda: starts, "the clip's encode started")
    voiced = in_background(eng.synthesize, "Voiced.", references=[ReferenceInput(wav, "The quick brown fox.")],
                           params=FAST)
    unvoiced = eng.synthesize("No voice meanwhile.", params=FAST)  # the worker did not wait for the encode
    assert len(unvoiced.audio) > 0 and not codes.done() and not voiced.done()
    released.set()
    result = codes.result(timeout=60)
    assert len(voiced.result(timeout=120).audio) > 0 and len(starts) == 1
    assert result.shape[0] == eng.models.codec.config.num_codebooks and result.shape[1] > 0
    np.testing.assert_array_equal(eng.encode_codes(wav), result)  # from the cache: no second encode
    assert len(starts) == 1


def test_a_failed_encode_of_codes_alone_fails_that_call_and_the_worker_carries_on(fresh_engine, speech, monkeypatch):
    eng = fresh_engine
    hold_encodes(eng, monkeypatch, fail_on=1)[0].set()
    with pytest.raises(RuntimeError, match="encoder out of order"):
        eng.encode_codes(speech.wav().read_bytes())
    assert len(eng.synthesize("Still here.", params=FAST).audio) > 0
    assert eng.encode_codes(speech.wav().read_bytes()).shape[1] > 0  # the next encode of it runs


def test_a_request_waiting_for_its_voice_survives_a_failed_decode_step(fresh_engine, speech, monkeypatch):
    eng = fresh_engine
    released, starts = hold_encodes(eng, monkeypatch)
    runner = eng._core.runner
    real_step = runner.step

    def failing_step(*args):
        monkeypatch.setattr(runner, "step", real_step)  # once
        raise RuntimeError("injected decode failure")

    ref = ReferenceInput(speech.wav().read_bytes(), "The quick brown fox.")
    voiced = in_background(eng.synthesize, "Voiced.", references=[ref], params=FAST)
    wait_until(lambda: starts, "the clip's encode started")
    monkeypatch.setattr(runner, "step", failing_step)
    with pytest.raises(RuntimeError, match="injected"):
        eng.synthesize("Fails in the step.", params=FAST)
    released.set()  # nothing else arrives: the worker must still start the voiced request
    assert len(voiced.result(timeout=30).audio) > 0


def _distinct_clips(speech, gains):
    """The test speech at different gains: one clip each, with a cache key of its own."""
    samples, rate = sf.read(speech.wav(), dtype="float32")
    return [ReferenceInput((rate, samples * gain), "The quick brown fox.") for gain in gains]


@pytest.fixture
def one_at_a_time_engine(tmp_path):
    eng = demo_engine(tmp_path, max_encode_batch=1)
    yield eng
    eng.close()


def test_with_max_encode_batch_1_new_voices_encode_one_at_a_time(one_at_a_time_engine, speech, monkeypatch):
    eng = one_at_a_time_engine
    released, starts = hold_encodes(eng, monkeypatch)
    refs = _distinct_clips(speech, (1.0, 0.8, 0.6))
    voiced = [in_background(eng.synthesize, f"Voiced {i}.", references=[ref], params=FAST) for i, ref in enumerate(refs)]
    wait_until(lambda: len(eng._core.clip_encodes._encoding) == len(refs), "every clip asked for")
    worker_iterations(eng)
    assert len(starts) == 1  # one runs, the others wait for it
    released.set()
    assert all(len(f.result(timeout=120).audio) > 0 for f in voiced)
    assert [len(batch) for batch in starts] == [1, 1, 1]


@pytest.mark.parametrize("waiting", [3, 4])
def test_new_voices_that_arrive_while_a_batch_encodes_encode_together_by_length(fresh_engine, speech, monkeypatch,
                                                                                waiting):
    """By default (max_encode_batch 8, capped by the demo engine's 4 slots): the first new clip
    encodes at once, alone; the clips that arrive meanwhile wait for it and then encode as batches
    of clips of similar length (at most max_batch each; 3 clips in one pass, in the bucket of 4),
    every request getting its voice."""
    eng = fresh_engine
    assert EngineConfig().max_encode_batch == 8
    assert eng._core.clip_encodes.encoder.max_batch == eng._core.runner.cache.n_slots == 4
    encoder = eng._core.clip_encodes.encoder
    released, starts = hold_encodes(eng, monkeypatch)
    samples, rate = sf.read(speech.wav(), dtype="float32")
    # within one chunk of a batched pass, at the clip's rate
    chunk = encoder.chunk_samples(encoder.max_batch) * rate // 44_100 * 9 // 10
    short = [np.resize(samples, chunk) * (1.0 - 0.1 * i) for i in range(waiting + 1)]
    long = np.resize(samples, 3 * chunk)  # three chunks: another length bucket
    refs = [ReferenceInput((rate, clip), "The quick brown fox.") for clip in [*short, long]]
    voiced = [in_background(eng.synthesize, "Voiced first.", references=[refs[0]], params=FAST)]
    wait_until(lambda: starts, "the clip's encode started")
    voiced += [in_background(eng.synthesize, f"Voiced {i}.", references=[ref], params=FAST)
               for i, ref in enumerate(refs[1:])]
    wait_until(lambda: len(eng._core.clip_encodes._encoding) == len(refs), "every clip asked for")
    worker_iterations(eng)
    assert len(starts) == 1 and len(starts[0]) == 1  # the first alone; the others wait for it
    released.set()
    assert all(len(f.result(timeout=120).audio) > 0 for f in voiced)
    # Then the other short clips as one batch, and the long one apart (in either order).
    alone, together = sorted(starts[1:], key=len)
    assert len(alone) == 1 and len(together) == waiting
    assert alone[0] > 2 * max(together)  # the long clip
    assert not eng._core.clip_encodes._encoding and eng.reference_cache.stats()["misses"] == len(refs)
    assert eng.stats()["reference_encodes"] == {"batches": len(starts), "clips": len(refs)}


def test_a_clip_whose_encode_fails_to_start_after_waiting_fails_only_its_requests(fresh_engine, speech, monkeypatch):
    eng, encodes = fresh_engine, fresh_engine._core.clip_encodes
    released, starts = hold_encodes(eng, monkeypatch, fail_on=2)
    first, second = _distinct_clips(speech, (1.0, 0.5))
    ok = in_background(eng.synthesize, "First voice.", references=[first], params=FAST)
    wait_until(lambda: len(starts) == 1, "the first clip's encode started")
    doomed = [in_background(eng.synthesize, f"Second voice {i}.", references=[second], params=FAST) for i in range(2)]
    wait_until(lambda: len(encodes._encoding) == 2 and len(encodes._awaiting) == 3, "the second clip waiting its turn")
    released.set()  # the first encode finishes; the second one's start then fails
    assert len(ok.result(timeout=120).audio) > 0
    for future in doomed:
        with pytest.raises(RuntimeError, match="encoder out of order"):
            future.result(timeout=120)
    wait_until(lambda: not encodes._encoding and not encodes._awaiting, "no clip left")
    assert len(eng.synthesize("Second voice again.", references=[second], params=FAST).audio) > 0  # not stuck


def test_a_queued_clip_whose_requests_all_went_away_is_not_encoded(fresh_engine, speech, monkeypatch):
    eng, encodes = fresh_engine, fresh_engine._core.clip_encodes
    released, starts = hold_encodes(eng, monkeypatch)
    first, second = _distinct_clips(speech, (1.0, 0.5))
    ok = in_background(eng.synthesize, "First voice.", references=[first], params=FAST)
    wait_until(lambda: len(starts) == 1, "the first clip's encode started")
    stream = eng.synthesize_stream("Second voice.", references=[second], params=FAST)
    reader = in_background(next, stream, None)
    wait_until(lambda: len(encodes._awaiting) == 2, "both requests waiting for their voices")
    next(run for run in encodes._awaiting if run.request.chunks == ["Second voice."]).job.cancel()
    wait_until(lambda: len(encodes._awaiting) == 1 and len(encodes._encoding) == 1, "the cancelled request gone")
    released.set()
    assert len(ok.result(timeout=120).audio) > 0 and reader.result(timeout=60) is None
    wait_until(lambda: not encodes._encoding, "no clip encoding")
    assert len(starts) == 1  # the second clip was never encoded
