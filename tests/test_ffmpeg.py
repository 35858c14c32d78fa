"""engine/ffmpeg.py: PATH's ffmpeg first, else the imageio-ffmpeg wheel's, reachable by name for
Gradio and pydub; decoding and encoding work with no ffmpeg on PATH."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import soundfile as sf

from engine import ffmpeg as ff
from tests.test_app_support import ROOT

imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")


def test_path_comes_first(tmp_path):
    program = tmp_path / ("ffmpeg.exe" if os.name == "nt" else "ffmpeg")
    program.write_text("#!/bin/sh\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    assert ff.find_ffmpeg(str(tmp_path)) == ff.Ffmpeg(str(program), "PATH")


def test_without_one_on_path_the_wheels_binary_is_found(tmp_path):
    found = ff.find_ffmpeg(str(tmp_path))  # an empty folder as the whole PATH
    assert found == ff.Ffmpeg(imageio_ffmpeg.get_ffmpeg_exe(), ff.WHEEL)


NO_PATH_FFMPEG = textwrap.dedent(
    """
    import io, os, shutil
    import numpy as np, soundfile as sf
    assert shutil.which("ffmpeg") is None, "the test's PATH must hold no ffmpeg"
    from engine import audio
    from engine.ffmpeg import ffmpeg
    chosen = ffmpeg()
    on_path = shutil.which("ffmpeg")  # what Gradio and pydub run
    assert on_path and os.path.samefile(on_path, chosen.path), (on_path, chosen)
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(44100 * 2) / 44100).astype(np.float32)
    # pydub's encoder, as on a libsndfile build without MP3
    audio._soundfile_can_write = lambda container, subtype: False
    mp3 = audio.encode_audio(tone, 44100, "mp3")
    data, rate = sf.read(io.BytesIO(mp3))
    assert rate == 44100 and abs(len(data) / rate - 2.0) < 0.1, (len(data), rate)
    print("ENCODED-OK", chosen.source)
    """
)


def test_with_no_ffmpeg_on_path_the_wheels_binary_serves_pydub_by_name(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {**os.environ, "PATH": str(bin_dir), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", NO_PATH_FFMPEG], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert f"ENCODED-OK {ff.WHEEL}" in result.stdout, result.stderr[-3000:]
    assert "from the imageio-ffmpeg wheel; none on PATH" in result.stderr  # the log says which


@pytest.fixture
def copies_only(tmp_path, monkeypatch):
    """A fake binary and this user's link folder, where links fail (Windows without developer mode,
    another volume) so that the binary is copied; PATH restored afterwards."""
    binary = tmp_path / "wheel" / ff._EXE
    binary.parent.mkdir()
    binary.write_bytes(b"ffmpeg 1")
    folder = tmp_path / "links"
    folder.mkdir()
    monkeypatch.setattr(ff, "_link_folder", lambda: folder)
    for name in ("symlink", "link"):
        monkeypatch.setattr(ff.os, name, lambda *_: (_ for _ in ()).throw(OSError("no links here")))
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))
    return binary, folder


def test_a_copy_of_the_same_binary_is_kept_and_a_changed_one_replaced(copies_only, monkeypatch):
    binary, folder = copies_only
    ff._put_on_path(str(binary))
    link = folder / ff._EXE
    assert link.read_bytes() == b"ffmpeg 1" and os.environ["PATH"].startswith(str(folder))
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(ff.os, "replace", lambda *a: (replaced.append(a), real_replace(*a)))
    ff._put_on_path(str(binary))
    assert replaced == []  # a copy with the binary's size and time is current
    binary.write_bytes(b"ffmpeg 2, upgraded")
    ff._put_on_path(str(binary))
    assert len(replaced) == 1 and link.read_bytes() == b"ffmpeg 2, upgraded"


def test_a_copy_that_cannot_be_replaced_serves_as_it_is(copies_only, monkeypatch):
    binary, folder = copies_only
    ff._put_on_path(str(binary))
    binary.write_bytes(b"ffmpeg 2, upgraded")

    def running(*_):  # Windows, while another instance runs the copy
        raise PermissionError(13, "Access is denied")

    monkeypatch.setattr(ff.os, "replace", running)
    ff._put_on_path(str(binary))
    assert (folder / ff._EXE).read_bytes() == b"ffmpeg 1" and os.environ["PATH"].startswith(str(folder))
    assert [p.name for p in folder.iterdir()] == [ff._EXE]  # nothing staged left behind


def test_with_no_copy_to_fall_back_on_a_private_folder_serves(copies_only, monkeypatch, tmp_path):
    binary, folder = copies_only
    private = tmp_path / "private"
    monkeypatch.setattr(ff.tempfile, "mkdtemp", lambda prefix: private.mkdir() or str(private))
    monkeypatch.setattr(ff.os, "replace", lambda *_: (_ for _ in ()).throw(PermissionError(13, "Access is denied")))
    ff._put_on_path(str(binary))
    assert os.environ["PATH"].split(os.pathsep)[0] == str(private)
    assert (private / ff._EXE).read_bytes() == b"ffmpeg 1"


def tone_wav(seconds: float, channels: int = 1) -> bytes:
    t = np.arange(int(44100 * seconds)) / 44100
    samples = np.stack([0.5 * np.sin(2 * np.pi * 440 * t)] * channels, axis=1)
    buffer = io.BytesIO()
    sf.write(buffer, samples, 44100, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def encode_m4a(wav: bytes, folder) -> bytes:
    # An MP4 file keeps its index at the end: decoding it from a pipe needs ffmpeg to seek back.
    out = folder / "encoded.m4a"
    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", "pipe:0", "-c:a", "aac", str(out)]
    subprocess.run(command, input=wav, capture_output=True, check=True)
    return out.read_bytes()


def flac_in_matroska(samples: np.ndarray, rate: int) -> bytes:
    """(frames, channels) float samples as FLAC in Matroska, a container libsndfile does not read."""
    wav = io.BytesIO()
    sf.write(wav, samples, rate, format="WAV", subtype="FLOAT")
    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", "pipe:0", "-c:a", "flac", "-f", "matroska", "pipe:1"]
    return subprocess.run(command, input=wav.getvalue(), capture_output=True, check=True).stdout


def decode_whole(source, max_seconds=None) -> tuple[np.ndarray, int]:
    with ff.decoded(source, max_seconds) as audio:
        return np.concatenate(list(audio.blocks(4096))), audio.samplerate


@pytest.mark.parametrize("as_path", [False, True])
def test_decodes_m4a_with_ffmpeg_alone(tmp_path, as_path):
    m4a = encode_m4a(tone_wav(1.5, channels=2), tmp_path)
    source = m4a
    if as_path:
        source = tmp_path / "-clip with spaces.m4a"  # a leading dash must not read as an option
        source.write_bytes(m4a)
        source = str(source)
    data, rate = decode_whole(source)
    assert rate == 44100 and data.shape[1] == 2 and data.dtype == np.float32
    assert abs(len(data) / rate - 1.5) < 0.1
    assert 0.3 < np.abs(data).max() < 0.7


def test_decoding_stops_at_the_limit(tmp_path):
    data, rate = decode_whole(encode_m4a(tone_wav(3.0), tmp_path), max_seconds=1.0)
    assert abs(len(data) / rate - 1.0) < 0.05


def test_a_many_channel_file_only_ffmpeg_reads_is_mixed_block_by_block(tmp_path):
    """FLAC of 8 channels at 96 kHz in Matroska (libsndfile reads no Matroska): 61 MB of float samples,
    mixed to one channel while ffmpeg decodes, never held whole; the mix is the source's mean."""
    import tracemalloc

    from engine import audio

    frames = 96_000 * 20
    source = (0.1 * np.random.default_rng(0).standard_normal((frames, 8))).astype(np.float32)
    mkv = flac_in_matroska(source, 96_000)
    tracemalloc.start()
    try:
        samples, rate = audio._decode(mkv, "clip", 30.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rate == 96_000 and samples.shape == (frames, 1)
    np.testing.assert_allclose(samples[:, 0], source.mean(axis=1, dtype=np.float32), atol=1e-6)  # FLAC: 24 bits
    assert peak < 3 * samples.nbytes, f"{peak / 1e6:.1f} MB at the peak for {samples.nbytes / 1e6:.1f} MB of output"


def test_a_rate_above_the_limit_is_refused_from_ffmpegs_header(tmp_path):
    from engine import audio

    mkv = flac_in_matroska(np.zeros((384_000, 2), np.float32), 384_000)
    with pytest.raises(audio.InputError, match="384000 Hz, above 192000 Hz"):
        audio._decode(mkv, "clip", 30.0)


def test_decoding_reports_what_ffmpeg_could_not_read_without_naming_the_input(tmp_path):
    upload = tmp_path / "server-side-upload.m4a"
    upload.write_bytes(b"this is not audio at all" * 20)
    for source in (upload.read_bytes(), str(upload)):
        with pytest.raises(ff.FfmpegError) as caught:
            decode_whole(source)
        message = str(caught.value)
        assert message and "Traceback" not in message
        assert str(tmp_path) not in message and "pipe:" not in message and "file:" not in message, message


def test_a_playlist_in_an_upload_makes_ffmpeg_fetch_and_read_nothing(tmp_path):
    import http.server
    import threading

    fetched = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            fetched.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    local = tmp_path / "other-voice.wav"
    local.write_bytes(tone_wav(1.0))  # a server file that a playlist could name
    try:
        for segment in (f"http://127.0.0.1:{listener.server_port}/segment.ts", str(local)):
            playlist = f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n{segment}\n#EXT-X-ENDLIST\n".encode()
            upload = tmp_path / "upload.m3u8"
            upload.write_bytes(playlist)
            for source in (playlist, str(upload)):
                with pytest.raises(ff.FfmpegError):
                    decode_whole(source)
    finally:
        listener.shutdown()
    assert fetched == []
