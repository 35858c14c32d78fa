"""engine.audio: loading reference clips from every source and format, bad inputs, encoders."""

import io
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from engine import audio
from engine.audio import (
    MIME_TYPES,
    OUTPUT_FORMATS,
    SAMPLE_RATE,
    encode_audio,
    guess_audio_extension,
    load_audio,
    to_int16,
    to_pcm16_bytes,
    wav_stream_header,
)
from engine.errors import InputError
from tests.audio_samples import VARIANTS, SpeechClips


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return SpeechClips(tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="module")
def speech(clips):
    """The espeak-ng clip as loaded by load_audio: the baseline for every variant."""
    return load_audio(clips.wav())


def tone(seconds=1.0, rate=SAMPLE_RATE, amplitude=0.5):
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


# ---- loading: good input -----------------------------------------------------------------------


def test_wav_is_resampled_to_44k_mono_float32(clips, speech):
    info = sf.info(clips.wav())
    assert info.samplerate == 22050
    assert speech.dtype == np.float32 and speech.ndim == 1
    assert abs(len(speech) - info.frames * 2) <= 2
    assert 0.05 < np.abs(speech).max() <= 1.05


def test_bytes_and_path_give_the_same_samples(clips, speech):
    assert np.array_equal(load_audio(clips.wav().read_bytes()), speech)
    assert np.array_equal(load_audio(str(clips.wav())), speech)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_format_loads_as_the_same_speech(clips, speech, variant):
    samples = load_audio(clips.variant(variant))
    assert samples.dtype == np.float32 and samples.ndim == 1
    # Lossy codecs add encoder delay and padding; the speech itself must be there.
    assert abs(len(samples) - len(speech)) < 0.1 * SAMPLE_RATE
    n = min(len(samples), len(speech))
    if variant in ("flac", "stereo"):  # lossless, identical channels
        assert np.allclose(samples[:n], speech[:n], atol=1e-4)
    else:
        assert 0.5 < np.sqrt(np.mean(samples**2) / np.mean(speech**2)) < 2.0


def test_browser_recording_bytes_load_through_ffmpeg(clips, speech):
    samples = load_audio(clips.variant("webm").read_bytes())
    assert abs(len(samples) - len(speech)) < 0.1 * SAMPLE_RATE


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not audio.MEMORY_FILES, reason="memory files are Linux's")
def test_uploaded_bytes_reach_libsndfile_as_a_memory_file_it_reads_without_python(clips, speech, monkeypatch):
    """From a Python file object libsndfile calls back into Python for every 8 KB (each call waits
    for the GIL beside a busy thread); uploads go to it by the path of an anonymous memory file, which
    is closed after, also when the bytes are not audio."""
    opened = []
    real = sf.SoundFile.__init__
    monkeypatch.setattr(sf.SoundFile, "__init__",
                        lambda self, file, *a, **k: opened.append(file) or real(self, file, *a, **k))
    before = open_descriptors()
    assert np.array_equal(load_audio(clips.wav().read_bytes()), speech)
    assert len(opened) == 1 and isinstance(opened[0], str) and opened[0].startswith("/proc/self/fd/")
    with pytest.raises(InputError, match="corrupt or not an audio file"):
        load_audio(b"this is plainly not audio " * 50)
    assert open_descriptors() == before


def test_without_memory_files_uploads_are_read_from_a_file_object(clips, speech, monkeypatch):
    """Where there are none (Windows, macOS), or /proc is missing: the same samples."""
    monkeypatch.setattr(audio, "MEMORY_FILES", False)
    assert np.array_equal(load_audio(clips.wav().read_bytes()), speech)
    assert np.array_equal(load_audio(clips.variant("mp3").read_bytes()), load_audio(clips.variant("mp3")))


@pytest.mark.skipif(not audio.MEMORY_FILES, reason="memory files are Linux's")
def test_a_memory_file_that_cannot_be_made_falls_back_to_a_file_object(clips, speech, monkeypatch):
    def refused(name):
        raise OSError("memfd_create refused (a sandbox)")

    monkeypatch.setattr(os, "memfd_create", refused)
    assert np.array_equal(load_audio(clips.wav().read_bytes()), speech)


def test_stereo_is_averaged_to_mono():
    left = tone()
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    assert np.allclose(load_audio((SAMPLE_RATE, stereo)), left / 2)


def test_a_many_channel_file_mixes_as_its_array_does_one_block_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(audio, "WHOLE_READ_SAMPLES", audio.BLOCK_FRAMES)  # files above it: block by block
    rng = np.random.default_rng(3)
    channels = (0.3 * rng.standard_normal((3 * audio.BLOCK_FRAMES + 123, 6))).astype(np.float32)
    path = tmp_path / "surround.wav"
    sf.write(path, channels, SAMPLE_RATE, subtype="FLOAT")
    read = []
    real_blocks = sf.SoundFile.blocks
    monkeypatch.setattr(sf.SoundFile, "blocks", lambda self, *a, **k: (read.append(b.shape) or b
                                                                       for b in real_blocks(self, *a, **k)))
    assert np.array_equal(load_audio(str(path)), load_audio((SAMPLE_RATE, channels)))
    assert len(read) == 4 and max(rows for rows, _ in read) == audio.BLOCK_FRAMES  # never the whole file


def test_a_clip_of_up_to_whole_read_samples_is_read_in_one_call(clips, speech, monkeypatch):
    """Each call into libsndfile lets go of the GIL and waits to take it back beside busy threads."""
    reads = []
    real_read = sf.SoundFile.read
    monkeypatch.setattr(sf.SoundFile, "read", lambda self, *a, **k: reads.append(k) or real_read(self, *a, **k))
    stereo = load_audio(clips.variant("stereo").read_bytes())
    assert len(reads) == 1 and np.array_equal(load_audio(clips.wav()), speech) and len(reads) == 2
    np.testing.assert_allclose(stereo, speech, atol=1e-4)


@pytest.mark.parametrize("rate", [384_000, 655_350])
def test_a_sample_rate_above_192_khz_is_refused_before_decoding(tmp_path, rate):
    path = tmp_path / "bomb.flac"  # a constant level compresses to little: 8 channels, 2 s
    sf.write(path, np.full((2 * rate, 8), 0.5, np.float32), rate, subtype="PCM_16")
    for source in (str(path), path.read_bytes(), (rate, np.full((rate, 1), 0.5, np.float32))):
        with pytest.raises(InputError, match=f"sample rate of {rate} Hz, above 192000 Hz"):
            load_audio(source)


def test_gradio_int16_tuple_matches_the_file(clips, speech):
    data, rate = sf.read(clips.wav(), dtype="int16")
    assert np.array_equal(load_audio((rate, data)), speech)


@pytest.mark.parametrize(
    "dtype, scale",
    [(np.int16, 32768), (np.int32, 2**31), (np.float32, 1.0), (np.float64, 1.0)],
)
def test_tuple_dtypes_are_scaled(dtype, scale):
    signal = tone()
    samples = load_audio((SAMPLE_RATE, (signal * scale * 0.99).astype(dtype)))
    assert np.allclose(samples, signal * 0.99, atol=1e-4)


def test_uint8_tuple_is_centred():
    signal = tone()
    samples = load_audio((SAMPLE_RATE, np.round(signal * 127 + 128).astype(np.uint8)))
    assert np.allclose(samples, signal, atol=1 / 64)


def test_channels_first_array_is_accepted():
    signal = tone()
    assert np.allclose(load_audio((SAMPLE_RATE, np.stack([signal, signal]))), signal)


def test_48k_tuple_is_resampled():
    samples = load_audio((48000, tone(rate=48000)))
    assert abs(len(samples) - SAMPLE_RATE) <= 1


# ---- loading: bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [b"\x00\x01garbage" * 500, b"this is plainly not audio " * 50, bytes(range(256)) * 20],
    ids=["binary", "text", "bytes"],
)
def test_corrupt_bytes(source):
    with pytest.raises(InputError, match="cannot read the uploaded audio: it is corrupt or not an audio file"):
        load_audio(source)


def test_text_file_named_wav(tmp_path):
    path = tmp_path / "fake.wav"
    path.write_text("not a wave file at all, just some words " * 20)
    with pytest.raises(InputError, match="cannot read audio file 'fake.wav'"):
        load_audio(path)


def test_truncated_wav_header(clips):
    with pytest.raises(InputError, match="only 0.00 s long"):
        load_audio(clips.wav().read_bytes()[:60])


def test_empty_bytes_and_empty_file(tmp_path):
    with pytest.raises(InputError, match="empty"):
        load_audio(b"")
    path = tmp_path / "empty.wav"
    path.touch()
    with pytest.raises(InputError, match="'empty.wav' is empty"):
        load_audio(path)


def test_empty_array():
    with pytest.raises(InputError, match="holds no audio samples"):
        load_audio((SAMPLE_RATE, np.zeros(0, dtype=np.int16)))


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="was not found"):
        load_audio(tmp_path / "nope.wav")


def test_a_file_removed_while_it_is_read_is_a_clear_error_too(tmp_path, speech, monkeypatch):
    """A saved voice deleted while a request reads its clip: the file goes right after load_audio
    first looks at it. Still an InputError (the server answers 404 for a deleted voice), never an
    OSError, which would be a 500."""
    path = tmp_path / "going.wav"
    sf.write(path, speech, SAMPLE_RATE)
    looked_at = pathlib.Path.stat

    def stat_then_remove(self, *args, **kwargs):
        result = looked_at(self, *args, **kwargs)
        if self == path and os.path.exists(path):
            os.remove(path)
        return result

    monkeypatch.setattr(pathlib.Path, "stat", stat_then_remove)
    with pytest.raises(InputError):
        load_audio(path)
    assert not os.path.exists(path)


def test_silent_file(tmp_path):
    if shutil.which("sox") is None:
        pytest.skip("needs sox to make a silent file (apt-get install sox)")
    path = tmp_path / "silence.wav"
    subprocess.run(["sox", "-n", "-r", "16000", str(path), "trim", "0", "2"], check=True)
    with pytest.raises(InputError, match=r"is silent \(peak level -inf dBFS"):
        load_audio(path)


def test_very_quiet_audio_is_silent_but_quiet_speech_is_not(speech):
    quiet = speech / np.abs(speech).max()
    with pytest.raises(InputError, match="-70 dBFS"):
        load_audio((SAMPLE_RATE, quiet * 10 ** (-70 / 20)))
    assert len(load_audio((SAMPLE_RATE, quiet * 10 ** (-50 / 20)))) == len(speech)


def test_nan_and_inf(tmp_path):
    signal = tone()
    signal[100] = np.nan
    with pytest.raises(InputError, match="NaN or infinite"):
        load_audio((SAMPLE_RATE, signal))
    signal[100] = np.inf
    path = tmp_path / "inf.wav"
    sf.write(path, signal, SAMPLE_RATE, subtype="FLOAT")
    with pytest.raises(InputError, match="NaN or infinite"):
        load_audio(path)


def test_too_long(clips):
    with pytest.raises(InputError, match=r"is 4\.\d s long; the limit is 2 s"):
        load_audio(clips.wav(), max_seconds=2)
    with pytest.raises(InputError, match="the limit is 2 s"):
        load_audio(clips.variant("m4a"), max_seconds=2)  # decoded by ffmpeg, checked after decoding
    assert len(load_audio(clips.wav(), max_seconds=10)) > 0


def test_too_short():
    with pytest.raises(InputError, match=r"only 0.30 s long; use at least 0.5 s"):
        load_audio((SAMPLE_RATE, tone(0.3)))


@pytest.mark.parametrize(
    "source, message",
    [
        ((0, np.zeros(100)), "sample rate"),
        ((44100.0, np.zeros(100)), "sample rate"),
        ((SAMPLE_RATE, np.zeros(100, dtype=np.complex64)), "integer or float"),
        ((SAMPLE_RATE, np.zeros((10, 10, 10))), "shape"),
        ((SAMPLE_RATE,), "pair"),
        (12345, "file bytes, a file path"),
    ],
)
def test_bad_arrays_and_types(source, message):
    with pytest.raises(InputError, match=message):
        load_audio(source)


def test_other_formats_without_ffmpeg(clips, monkeypatch):
    monkeypatch.setattr(audio, "ffmpeg_available", lambda: False)
    with pytest.raises(InputError, match="needs ffmpeg"):
        load_audio(clips.variant("m4a"))
    assert len(load_audio(clips.variant("mp3"))) > 0  # libsndfile reads MP3 itself


# ---- encoding ----------------------------------------------------------------------------------


def test_int16_conversion_clips_and_zeroes_nan():
    pcm = to_int16(np.array([0.0, 0.5, 1.0, 1.5, -1.0, -3.0, np.nan, np.inf, -np.inf, -np.nan], dtype=np.float32))
    assert pcm.tolist() == [0, 16384, 32767, 32767, -32767, -32767, 0, 32767, -32767, 0]
    halves = np.array([[0.5, 1.5, 2.5, -2.5]]) / 32767  # float64, 2-D: flattened, float32 ties to even
    assert to_int16(halves).tolist() == np.rint(halves.astype(np.float32) * np.float32(32767)).astype(int).ravel().tolist()
    assert to_pcm16_bytes(np.array([1.0, -1.0])) == b"\xff\x7f\x01\x80"


def test_wav_and_pcm_carry_the_same_samples():
    signal = tone(0.7)
    blob = encode_audio(signal, SAMPLE_RATE, "wav")
    assert sf.info(io.BytesIO(blob)).subtype == "PCM_16"
    data, rate = sf.read(io.BytesIO(blob), dtype="int16")
    assert rate == SAMPLE_RATE
    assert np.array_equal(data, to_int16(signal))
    assert encode_audio(signal, SAMPLE_RATE, "pcm") == to_pcm16_bytes(signal)


def test_flac_is_lossless():
    signal = tone(0.7)
    data, rate = sf.read(io.BytesIO(encode_audio(signal, SAMPLE_RATE, "FLAC")), dtype="int16")
    assert rate == SAMPLE_RATE and np.array_equal(data, to_int16(signal))


@pytest.mark.parametrize("fmt, rate", [("mp3", SAMPLE_RATE), ("opus", 48000)])
def test_lossy_formats_decode_to_the_same_length(fmt, rate):
    signal = tone(2.0)
    blob = encode_audio(signal, SAMPLE_RATE, fmt)
    data, got_rate = sf.read(io.BytesIO(blob))
    assert got_rate == rate
    assert abs(len(data) / got_rate - 2.0) < 0.1
    assert 0.3 < np.abs(data).max() < 0.7


@pytest.mark.parametrize("fmt, rate", [("mp3", SAMPLE_RATE), ("opus", 48000)])
def test_ffmpeg_fallback_for_old_libsndfile(fmt, rate, monkeypatch):
    if not audio.ffmpeg_available():
        pytest.skip("needs ffmpeg (apt-get install ffmpeg)")
    monkeypatch.setattr(audio, "_soundfile_can_write", lambda container, subtype: False)
    data, got_rate = sf.read(io.BytesIO(encode_audio(tone(2.0), SAMPLE_RATE, fmt)))
    assert got_rate == rate and abs(len(data) / got_rate - 2.0) < 0.1


def test_mp3_without_ffmpeg_or_libsndfile_support(monkeypatch):
    monkeypatch.setattr(audio, "_soundfile_can_write", lambda container, subtype: False)
    monkeypatch.setattr(audio, "ffmpeg_available", lambda: False)
    with pytest.raises(InputError, match="mp3 output with this libsndfile build needs ffmpeg"):
        encode_audio(tone(), SAMPLE_RATE, "mp3")


def test_unknown_format():
    with pytest.raises(InputError, match="choose one of wav, pcm, flac, mp3, opus"):
        encode_audio(tone(), SAMPLE_RATE, "aiff")


def test_every_format_has_a_mime_type():
    assert set(MIME_TYPES) == set(OUTPUT_FORMATS)
    assert MIME_TYPES["mp3"] == "audio/mpeg" and MIME_TYPES["wav"] == "audio/wav"


def test_streamed_wav_is_readable():
    chunks = [tone(0.3), tone(0.2, amplitude=0.9)]
    header = wav_stream_header(SAMPLE_RATE)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    stream = header + b"".join(to_pcm16_bytes(chunk) for chunk in chunks)
    data, rate = sf.read(io.BytesIO(stream), dtype="int16")
    assert rate == SAMPLE_RATE
    assert np.array_equal(data, np.concatenate([to_int16(chunk) for chunk in chunks]))


@pytest.mark.parametrize("variant, extension", [("flac", "flac"), ("ogg", "ogg"), ("mp3", "mp3"), ("m4a", "m4a"), ("webm", "webm")])
def test_extension_sniffing(clips, variant, extension):
    assert guess_audio_extension(clips.variant(variant).read_bytes()) == extension
    assert guess_audio_extension(clips.wav().read_bytes()) == "wav"
    assert guess_audio_extension(b"hello world") is None
