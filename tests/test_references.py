"""engine.references: content hashes, the reference-code cache, saved voices and default dirs."""

import hashlib
import os
import sys
import threading

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.audio import SAMPLE_RATE, load_audio
from engine.errors import InputError, VoiceExistsError, VoiceNotFoundError
from engine.references import (
    APP_NAME,
    DecodedClips,
    ReferenceCodeCache,
    content_hash,
    default_cache_dir,
    default_voices_dir,
)
from engine.voice_store import VoiceStore
from tests.audio_samples import SpeechClips
from tests.waiting import wait_until


def clip(seed: int, seconds: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * SAMPLE_RATE)).astype(np.float32)


class CountingEncoder:
    """Stand-in codec: deterministic codes from the samples, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, samples: np.ndarray) -> torch.Tensor:
        self.calls += 1
        frames = max(1, len(samples) // 2048)
        return (torch.arange(10 * frames).reshape(10, frames) + int(abs(samples[0]) * 1000)) % 1024


def lookup(cache: ReferenceCodeCache, samples: np.ndarray) -> tuple[str, torch.Tensor | None]:
    """The clip's key and its cached codes (a copy) or None, as the engine asks for them."""
    key = cache.key(samples)
    return key, cache.cached_copy(key)


def get_codes(cache: ReferenceCodeCache, encoder, samples: np.ndarray) -> torch.Tensor:
    """What the engine does with a clip: the cached codes, else the clip encoded and kept."""
    key, codes = lookup(cache, samples)
    return codes if codes is not None else cache.put(key, encoder(samples)).clone()


# ---- content hash ------------------------------------------------------------------------------


def test_content_hash_of_bytes_is_sha256():
    assert content_hash(b"abc") == hashlib.sha256(b"abc").hexdigest()
    assert content_hash(bytearray(b"abc")) == content_hash(memoryview(b"abc"))


def test_content_hash_of_arrays():
    samples = clip(0)
    assert content_hash(samples) == content_hash(samples.copy())
    assert content_hash(samples) != content_hash(clip(1))
    assert content_hash(samples) != content_hash(samples.astype(np.float64))  # dtype counts
    assert content_hash(samples[::2]) == content_hash(np.ascontiguousarray(samples[::2]))
    with pytest.raises(TypeError):
        content_hash("text")


# ---- reference-code cache ----------------------------------------------------------------------


def test_memory_hit_encodes_once():
    encoder = CountingEncoder()
    cache = ReferenceCodeCache(cache_dir=None)
    first = get_codes(cache, encoder, clip(0))
    second = get_codes(cache, encoder, clip(0))
    assert torch.equal(first, second) and first.shape == (10, SAMPLE_RATE // 2048)
    assert encoder.calls == 1
    assert cache.stats() == {"memory_hits": 1, "disk_hits": 0, "misses": 1, "items": 1}
    assert cache.hits == 1 and cache.misses == 1


def test_looked_up_codes_are_a_copy():
    cache = ReferenceCodeCache(cache_dir=None)
    codes = get_codes(cache, CountingEncoder(), clip(0))
    expected = codes.clone()
    codes.fill_(7)
    _, again = lookup(cache, clip(0))
    assert torch.equal(again, expected)
    again.fill_(7)
    assert torch.equal(lookup(cache, clip(0))[1], expected)


def test_lru_evicts_the_oldest():
    encoder = CountingEncoder()
    cache = ReferenceCodeCache(cache_dir=None, max_items=2)
    for seed in (0, 1, 0, 2):  # 0 is used again, so 1 is the oldest when 2 arrives
        get_codes(cache, encoder, clip(seed))
    assert encoder.calls == 3 and len(cache) == 2
    get_codes(cache, encoder, clip(0))
    assert encoder.calls == 3
    get_codes(cache, encoder, clip(1))
    assert encoder.calls == 4


def test_disk_cache_survives_a_restart(tmp_path):
    first = ReferenceCodeCache(tmp_path, fingerprint="codec-a")
    codes = get_codes(first, CountingEncoder(), clip(0))
    files = list(tmp_path.glob("*.pt"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    second = ReferenceCodeCache(tmp_path, fingerprint="codec-a")
    _, loaded = lookup(second, clip(0))
    assert torch.equal(loaded, codes) and second.disk_hits == 1


def test_fingerprints_never_share_entries(tmp_path):
    get_codes(ReferenceCodeCache(tmp_path, fingerprint="codec-a"), CountingEncoder(), clip(0))
    assert lookup(ReferenceCodeCache(tmp_path, fingerprint="codec-b"), clip(0))[1] is None
    assert lookup(ReferenceCodeCache(tmp_path, fingerprint="codec-a"), clip(0))[1] is not None


@pytest.mark.parametrize("damage", [b"", b"not a torch file", b"PK\x03\x04broken zip"])
def test_corrupt_cache_file_is_rewritten(tmp_path, damage):
    codes = get_codes(ReferenceCodeCache(tmp_path), CountingEncoder(), clip(0))
    (path,) = tmp_path.glob("*.pt")
    path.write_bytes(damage)
    encoder = CountingEncoder()
    assert torch.equal(get_codes(ReferenceCodeCache(tmp_path), encoder, clip(0)), codes)
    assert encoder.calls == 1
    assert torch.equal(torch.load(path, weights_only=True), codes)


def test_cache_file_with_wrong_content_is_rewritten(tmp_path):
    codes = get_codes(ReferenceCodeCache(tmp_path), CountingEncoder(), clip(0))
    (path,) = tmp_path.glob("*.pt")
    torch.save(torch.zeros(3), path)  # a readable tensor, but not codes
    encoder = CountingEncoder()
    assert torch.equal(get_codes(ReferenceCodeCache(tmp_path), encoder, clip(0)), codes)
    assert encoder.calls == 1


def test_unwritable_cache_dir_still_serves(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    encoder = CountingEncoder()
    cache = ReferenceCodeCache(blocker / "cache")
    get_codes(cache, encoder, clip(0))
    get_codes(cache, encoder, clip(0))
    assert encoder.calls == 1


def wait_for_trims(cache: ReferenceCodeCache, timeout: float = 10.0) -> None:
    wait_until(lambda: not cache._trimming.is_set(), "the cache's trim finished", timeout)


def test_the_disk_cache_stays_under_its_bound_dropping_the_least_recently_used(tmp_path):
    """A server that keeps getting new clips must not fill its disk: past the bound, the files used
    longest ago go (a disk hit counts as a use), down to TRIM_TO of it."""
    encoder = CountingEncoder()
    probe = ReferenceCodeCache(tmp_path / "probe")
    get_codes(probe, encoder, clip(0))
    (one,) = (tmp_path / "probe").glob("*.pt")
    size = one.stat().st_size  # every clip below has as many frames: files of one size
    cache = ReferenceCodeCache(tmp_path / "codes", max_items=1, max_disk_bytes=5 * size)
    keys = []
    for seed in range(5):  # at the bound, not past it
        get_codes(cache, encoder, clip(seed))
        keys.append(cache.key(clip(seed)))
        wait_for_trims(cache)
        os.utime(cache._path(keys[-1]), (1000.0 + seed, 1000.0 + seed))  # distinct ages, oldest first
    assert len(list((tmp_path / "codes").glob("*.pt"))) == 5
    get_codes(cache, encoder, clip(1))  # from disk (memory holds only the last): clip 1 used again
    assert cache.disk_hits == 1
    get_codes(cache, encoder, clip(5))  # six files: over the bound, trimmed to 4 (TRIM_TO 0.8)
    wait_for_trims(cache)
    kept = {path.stem for path in (tmp_path / "codes").glob("*.pt")}
    assert kept == {keys[1], keys[3], keys[4], cache.key(clip(5))}  # clips 0 and 2 were the oldest
    assert not list((tmp_path / "codes").glob("*.tmp"))
    calls = encoder.calls
    get_codes(ReferenceCodeCache(tmp_path / "codes"), encoder, clip(0))  # trimmed: encoded again
    assert encoder.calls == calls + 1


def test_a_file_trimmed_by_another_process_is_a_miss_not_an_error(tmp_path):
    cache = ReferenceCodeCache(tmp_path, max_items=1)
    encoder = CountingEncoder()
    get_codes(cache, encoder, clip(0))
    get_codes(cache, encoder, clip(1))  # memory now holds clip 1 only
    wait_for_trims(cache)
    cache._path(cache.key(clip(0))).unlink()
    get_codes(cache, encoder, clip(0))
    assert encoder.calls == 3 and cache.disk_hits == 0


def test_bad_encoder_output_is_an_error():
    cache = ReferenceCodeCache(cache_dir=None)
    key, _ = lookup(cache, clip(0))
    with pytest.raises(ValueError, match="2-D integer tensor"):
        cache.put(key, torch.zeros(10, 3))


# ---- voice store -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return SpeechClips(tmp_path_factory.mktemp("speech"))


@pytest.fixture
def store(tmp_path):
    return VoiceStore(tmp_path / "voices")


def test_add_from_path_keeps_the_file(store, clips):
    folder = store.add("Alice", clips.wav(), "  The quick brown fox.  ")
    audio_path, transcript = store.get("Alice")
    assert audio_path == folder / "sample.wav"
    assert audio_path.read_bytes() == clips.wav().read_bytes()
    assert transcript == "The quick brown fox."
    assert (folder / "transcript.txt").is_file()


def test_add_from_bytes_sniffs_the_format(store, clips):
    store.add("browser take", clips.variant("webm").read_bytes(), "hello")
    audio_path, _ = store.get("browser take")
    assert audio_path.name == "sample.webm"
    assert len(load_audio(audio_path)) > SAMPLE_RATE


def test_add_from_array_stores_wav(store, clips):
    data, rate = sf.read(clips.wav(), dtype="int16")
    store.add("from-gradio", (rate, data), "hello")
    audio_path, _ = store.get("from-gradio")
    assert audio_path.suffix == ".wav"
    assert np.allclose(load_audio(audio_path), load_audio((rate, data)), atol=1e-4)


def test_list_is_sorted_and_exists(store, clips):
    for voice_id in ("bob", "Alice", "carol_2"):
        store.add(voice_id, clips.wav(), "text")
    assert store.list() == ["Alice", "bob", "carol_2"]
    assert store.exists("bob") and not store.exists("dave") and not store.exists("../bob")


def test_duplicate_id(store, clips):
    store.add("Alice", clips.wav(), "text")
    with pytest.raises(VoiceExistsError, match="'Alice' already exists"):
        store.add("Alice", clips.wav(), "other text")


def test_ids_ignore_case_on_every_file_system(store, clips):
    """"narrator" names the voice saved as "Narrator" (as on Windows and macOS, whose file systems
    ignore case), and another voice cannot take the same id in another case."""
    store.add("Narrator", clips.wav(), "text")
    assert store.exists("narrator") and store.get("NARRATOR") == store.get("Narrator")
    with pytest.raises(VoiceExistsError, match="'Narrator' already exists"):
        store.add("narrator", clips.wav(), "other text")
    store.add("Guide", clips.wav(), "text")
    with pytest.raises(VoiceExistsError, match="'Guide' already exists"):
        store.rename("narrator", "guide")
    store.rename("narrator", "Storyteller")
    assert store.list() == ["Guide", "Storyteller"]
    store.delete("GUIDE")
    assert store.list() == ["Storyteller"]


@pytest.mark.parametrize(
    "voice_id, message",
    [
        ("", "non-empty"),
        ("a/b", "only letters"),
        ("../escape", "only letters"),
        (".hidden", "only letters"),
        ("tab\there", "only letters"),
        ("émile", "only letters"),
        (" padded", "start or end with a space"),
        ("x" * 256, "limit is 255"),
        (None, "non-empty string"),
        ("con", "Windows keeps that name"),
        ("Lpt9", "Windows keeps that name"),
    ],
)
def test_bad_voice_ids(store, clips, voice_id, message):
    with pytest.raises(InputError, match=message):
        store.add(voice_id, clips.wav(), "text")
    assert store.list() == []


def test_a_voice_is_not_renamed_to_a_windows_device_name_but_one_saved_as_one_stays_readable(store, clips):
    store.add("narrator", clips.wav(), "text")
    with pytest.raises(InputError, match="Windows keeps that name"):
        store.rename("narrator", "NUL")
    (store.root / "narrator").rename(store.root / "aux")  # saved where such names are files, or by hand
    assert store.list() == ["aux"] and store.get("aux")[1] == "text"
    store.rename("aux", "narrator")
    assert store.list() == ["narrator"]


def test_longest_valid_id(store, clips):
    store.add("x" * 255, clips.wav(), "text")
    assert store.list() == ["x" * 255]


def test_empty_transcript(store, clips):
    with pytest.raises(InputError, match="transcript is empty"):
        store.add("Alice", clips.wav(), "  \n ")


def test_a_transcript_that_is_not_text_is_refused_and_saves_nothing(store, clips):
    with pytest.raises(InputError, match="not text"):
        store.add("Alice", clips.wav(), "a\ud800b")  # a lone surrogate, as JSON's "\ud800" decodes
    assert store.list() == []


def test_bad_audio_saves_nothing(store):
    with pytest.raises(InputError, match="is silent"):
        store.add("quiet", (SAMPLE_RATE, np.zeros(SAMPLE_RATE, dtype=np.int16)), "text")
    with pytest.raises(InputError, match="corrupt"):
        store.add("broken", b"definitely not audio" * 100, "text")
    assert store.list() == [] and _entries(store) == []


def test_max_seconds_applies_to_added_voices(tmp_path, clips):
    store = VoiceStore(tmp_path, max_seconds=1.0)
    with pytest.raises(InputError, match="the limit is 1 s"):
        store.add("long", clips.wav(), "text")


def test_unknown_voice_names_the_id_and_how_to_list_voices_but_neither_voices_nor_paths(store, clips):
    store.add("Alice", clips.wav(), "text")
    for call in (lambda: store.get("Bob"), lambda: store.delete("Bob"), lambda: store.rename("Bob", "Carol")):
        with pytest.raises(VoiceNotFoundError) as caught:
            call()
        message = str(caught.value)
        assert message.startswith("voice not found") and "'Bob'" in message and "/v1/references/list" in message
        assert "Alice" not in message and str(store.root) not in message
        assert isinstance(caught.value, KeyError) and isinstance(caught.value, InputError)


def test_start_up_removes_what_interrupted_adds_and_deletes_left_and_keeps_live_ones(tmp_path, clips):
    store = VoiceStore(tmp_path / "voices")
    store.add("Alice", clips.wav(), "text")
    dead = [tmp_path / "voices" / name for name in (".adding-4194305-ab12", ".deleted-4194305-cd34", ".adding-ef56")]
    live = tmp_path / "voices" / f".adding-{os.getppid()}-0a0b"  # a process that runs: its add goes on
    for folder in (*dead, live):
        folder.mkdir()
        (folder / "sample.wav").write_bytes(b"half a file")
    (tmp_path / "voices" / f".adding-{os.getpid()}-77").mkdir()  # this process has made none yet: a dead one's pid
    restarted = VoiceStore(tmp_path / "voices")
    assert not any(folder.exists() for folder in dead) and not (tmp_path / "voices" / f".adding-{os.getpid()}-77").exists()
    assert live.exists() and restarted.list() == ["Alice"]
    assert restarted.get("Alice")[1] == "text"


def test_a_voice_that_cannot_be_used_is_refused_when_added(tmp_path, clips):
    def check(samples, transcript):
        if len(transcript) > 10:
            raise InputError("prompt too long")

    store = VoiceStore(tmp_path / "voices", check_voice=check)
    with pytest.raises(InputError, match="prompt too long"):
        store.add("long", clips.wav(), "a transcript far over ten characters")
    assert store.list() == [] and _entries(store) == []
    store.add("short", clips.wav(), "fine")
    assert store.list() == ["short"]


def test_delete(store, clips):
    store.add("Alice", clips.wav(), "text")
    store.delete("Alice")
    assert store.list() == [] and not store.exists("Alice")
    assert _entries(store) == []
    with pytest.raises(VoiceNotFoundError):
        store.delete("Alice")


def test_rename(store, clips):
    store.add("Alice", clips.wav(), "text")
    store.add("Bob", clips.wav(), "text")
    with pytest.raises(VoiceExistsError, match="'Bob' already exists"):
        store.rename("Alice", "Bob")
    with pytest.raises(VoiceNotFoundError):
        store.rename("Carol", "Dave")
    with pytest.raises(InputError, match="only letters"):
        store.rename("Alice", "a/b")
    store.rename("Alice", "Alice 2")
    assert store.list() == ["Alice 2", "Bob"]
    assert store.get("Alice 2")[1] == "text"
    store.rename("Bob", "bob")  # case-only rename
    assert store.list() == ["Alice 2", "bob"]


def test_reads_reference_server_folders(store, clips):
    folder = store.root / "fish voice"
    folder.mkdir()
    (folder / "ref.flac").write_bytes(clips.variant("flac").read_bytes())
    (folder / "ref.lab").write_text("Spoken words.\n", encoding="utf-8")
    assert store.list() == ["fish voice"]
    audio_path, transcript = store.get("fish voice")
    assert audio_path == folder / "ref.flac" and transcript == "Spoken words."


def test_incomplete_folders_are_not_listed(store, clips):
    (store.root / "no transcript").mkdir()
    (store.root / "no transcript" / "a.wav").write_bytes(clips.wav().read_bytes())
    (store.root / "no audio").mkdir()
    (store.root / "no audio" / "transcript.txt").write_text("words")
    (store.root / "stray file.txt").write_text("not a folder")
    assert store.list() == []
    with pytest.raises(VoiceNotFoundError, match="incomplete"):
        store.get("no transcript")
    with pytest.raises(VoiceExistsError):
        store.add("no audio", clips.wav(), "text")


def test_concurrent_adds_of_one_id(store, clips):
    data = clips.wav().read_bytes()
    outcomes = []

    def worker(index):
        try:
            store.add("race", data, f"take {index}")
            outcomes.append("added")
        except VoiceExistsError:
            outcomes.append("exists")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["added"] + ["exists"] * 5
    assert store.list() == ["race"]
    assert _entries(store) == ["race"]  # no staging folders left


# ---- default dirs ------------------------------------------------------------------------------


def test_default_dirs_use_platformdirs():
    assert default_cache_dir().name == APP_NAME
    assert default_voices_dir().name == "voices" and default_voices_dir().parent.name == APP_NAME


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG variables apply on Linux only")
def test_default_dirs_follow_xdg_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_cache_dir() == tmp_path / "cache" / APP_NAME
    assert default_voices_dir() == tmp_path / "data" / APP_NAME / "voices"


def test_default_dirs_can_be_overridden(tmp_path):
    assert default_cache_dir(tmp_path / "c") == tmp_path / "c"
    assert default_voices_dir(str(tmp_path / "v")) == tmp_path / "v"


# ---- decoded clips ----------------------------------------------------------------------------


class CountingDecoder:
    """load_audio plus a key, counting its calls (DecodedClips' decode)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, source):
        self.calls += 1
        samples = load_audio(source)
        return samples, content_hash(samples)


def wav_bytes(samples: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    sf.write(buffer, samples, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def test_the_same_bytes_are_decoded_once():
    decode = CountingDecoder()
    clips = DecodedClips(decode)
    data = wav_bytes(clip(1))
    first, key = clips.get(data)
    again, key_again = clips.get(bytes(data))  # equal bytes, another object: known by content
    assert decode.calls == 1 and clips.hits == 1
    assert again is first and key_again == key == content_hash(load_audio(data))
    with pytest.raises(ValueError):  # shared between requests: nobody may change them
        first[0] = 0.0
    clips.get(wav_bytes(clip(2)))
    assert decode.calls == 2


def test_a_file_written_again_is_decoded_again(tmp_path):
    import os

    decode = CountingDecoder()
    clips = DecodedClips(decode)
    path = tmp_path / "voice.wav"
    sf.write(path, clip(1), SAMPLE_RATE, subtype="FLOAT")
    first, key = clips.get(path)
    assert clips.get(str(path))[1] == key and decode.calls == 1
    sf.write(path, clip(2), SAMPLE_RATE, subtype="FLOAT")  # same size: the modification time tells
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    changed, changed_key = clips.get(path)
    assert decode.calls == 2 and changed_key != key
    assert np.array_equal(changed, load_audio(path))


def test_a_file_replaced_with_the_same_size_and_mtime_is_decoded_again(tmp_path):
    import os

    decode = CountingDecoder()
    clips = DecodedClips(decode)
    path = tmp_path / "voice.wav"
    sf.write(path, clip(1), SAMPLE_RATE, subtype="FLOAT")
    stat = os.stat(path)
    _, key = clips.get(path)
    path.unlink()  # a voice deleted and saved again within one coarse mtime tick
    sf.write(path, clip(2), SAMPLE_RATE, subtype="FLOAT")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size and os.stat(path).st_mtime_ns == stat.st_mtime_ns
    assert clips.get(path)[1] != key and decode.calls == 2


def test_a_file_that_changes_while_it_is_decoded_is_not_kept(tmp_path):
    path = tmp_path / "voice.wav"
    sf.write(path, clip(1), SAMPLE_RATE, subtype="FLOAT")

    def decode_then_rewrite(source):  # another program writes the file meanwhile
        decoded = load_audio(source)
        sf.write(path, clip(2), SAMPLE_RATE, subtype="FLOAT")
        return decoded, content_hash(decoded)

    clips = DecodedClips(decode_then_rewrite)
    clips.get(path)
    assert len(clips) == 0


def test_a_strided_memoryview_is_known_by_its_bytes():
    decode = CountingDecoder()
    clips = DecodedClips(lambda source: decode(bytes(source)))
    data = wav_bytes(clip(1))
    doubled = memoryview(bytes(b for byte in data for b in (byte, 0)))[::2]  # not contiguous
    assert not doubled.c_contiguous and doubled.tobytes() == data
    assert clips.get(doubled)[1] == clips.get(data)[1] and decode.calls == 1


def test_arrays_and_failures_are_not_kept():
    decode = CountingDecoder()
    clips = DecodedClips(decode)
    recording = (SAMPLE_RATE, clip(3))
    clips.get(recording)
    clips.get(recording)
    assert decode.calls == 2 and len(clips) == 0
    broken = b"RIFF not really a wav file" * 20
    for _ in range(2):
        with pytest.raises(InputError):
            clips.get(broken)
    assert decode.calls == 4 and len(clips) == 0


def test_decoded_clips_keep_at_most_max_bytes():
    decode = CountingDecoder()
    one = clip(1).nbytes
    clips = DecodedClips(decode, max_bytes=2 * one)
    sources = [wav_bytes(clip(seed)) for seed in range(3)]
    for data in sources:
        clips.get(data)
    assert len(clips) == 2
    clips.get(sources[2])  # kept: the newest
    assert decode.calls == 3
    clips.get(sources[0])  # dropped: the oldest
    assert decode.calls == 4
    too_big = DecodedClips(CountingDecoder(), max_bytes=one - 1)
    too_big.get(sources[0])
    assert len(too_big) == 0


def _add_when_released(root, data, barrier, results, index):
    barrier.wait()
    try:
        VoiceStore(root).add("shared", data, "text")
        results[index] = "saved"
    except VoiceExistsError:
        results[index] = "exists"
    except Exception as exc:  # what an unlocked race gives: the second rename onto a full folder
        results[index] = f"failed: {type(exc).__name__}"


def test_processes_adding_one_voice_take_turns(tmp_path, clips):
    """Replicas of a cluster share the folder: of processes saving one id at the same moment one
    saves it, the others are told it exists (no OSError from a rename race, no stray folders)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    processes = 4
    barrier, results = context.Barrier(processes), context.Manager().list([None] * processes)
    data = clips.wav()
    workers = [context.Process(target=_add_when_released, args=(tmp_path, data, barrier, results, i))
               for i in range(processes)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert sorted(results) == ["exists"] * (processes - 1) + ["saved"]
    store = VoiceStore(tmp_path)
    assert store.list() == ["shared"]
    assert _entries(store) == ["shared"]


def _entries(store) -> list[str]:
    """What the voices folder holds besides the writers' lock file."""
    return sorted(p.name for p in store.root.iterdir() if p.name != VoiceStore.LOCK_FILE)
