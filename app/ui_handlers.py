"""What the UI's buttons do. Layout and wiring are in app.ui; this module has the behaviour.

Each action exists twice over one function: the page's event writes errors next to the control that
caused them, the public API event raises them for gradio_client (app.ui_errors).
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from dataclasses import dataclass

import gradio as gr
import numpy as np

from engine import params as P
from engine.audio import encode_audio, load_audio, to_int16
from engine.errors import InputError
from engine.facade import ReferenceInput, SynthesisResult
from engine.params import SamplingParams
from engine.voice_store import is_windows_device_name

from .batch_input import batch_texts
from .clip_check import MIN_VOICE_SECONDS, check_clip
from .errors import problem_for
from .outputs import OutputDir, write_file, zip_files
from .settings import AppSettings
from .speech import SpeechService, StreamStats, Voice

log = logging.getLogger("app.ui")

# Dropdown values that cannot clash with a voice id (ids allow letters, digits, space, - and _).
NO_VOICE = "<none>"
UPLOADED = "<uploaded>"
NO_VOICE_LABEL = "Default voice (no reference)"
UPLOADED_LABEL = "Clip in the Voice clone tab (not saved)"

# Streaming playback is smoother with chunks of a second or more (Gradio's streaming guide);
# the first chunk still goes out at once so the listener hears something early.
MIN_STREAM_CHUNK_S = 1.0

BATCH_HEADERS = ["#", "text", "status", "audio length (s)"]
HISTORY_HEADERS = ["when", "text", "voice", "format", "seed", "audio length (s)"]
HISTORY_LIMIT = 50
PREFERRED_FORMATS = ("wav", "mp3", "flac", "opus")


@dataclass(frozen=True)
class SamplingDefaults:
    """The reference web UI's defaults (fish-speech tools/webui): no token limit, chunk length 300."""

    temperature: float = 0.8
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    max_new_tokens: int = 0
    chunk_length: int = 300
    seed: int = 0


DEFAULTS = SamplingDefaults()
SAMPLING_NAMES = ("temperature", "top_p", "repetition_penalty", "max_new_tokens", "chunk_length", "seed")


def available_formats() -> list[str]:
    """The download formats this machine can encode (mp3 and opus need libsndfile support or ffmpeg)."""
    probe = np.zeros(441, dtype=np.float32)
    usable = []
    for fmt in PREFERRED_FORMATS:
        try:
            encode_audio(probe, 44100, fmt)
        except Exception:  # noqa: BLE001 - any failure means "not offered here"
            continue
        usable.append(fmt)
    return usable


# ----- errors -------------------------------------------------------------------------------------


def sampling_params(temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed) -> SamplingParams:
    return SamplingParams(
        temperature=float(temperature),
        top_p=float(top_p),
        repetition_penalty=float(repetition_penalty),
        max_new_tokens=int(max_new_tokens),
        chunk_length=int(chunk_length),
        seed=int(seed),
    )


def concrete_seed(seed) -> int:
    """0 means "a new one each time" (the reference UI's convention); the seed picked is returned so
    that the history can make the same audio again."""
    low, high = P.SEED_RANGE
    if seed is not None and (not float(seed).is_integer() or not low <= seed <= high):
        raise InputError(f"Seed (Advanced settings) must be a whole number from {low} to {high:,}, got {seed:g}; "
                         "0 = a new seed each time")
    seed = int(seed or 0)
    return seed if seed > 0 else 1 + secrets.randbelow(high)


def stats_markdown(audio_s: float, rtf: float | None, ttfa_s: float | None, seed: int | None = None) -> str:
    parts = [f"**Audio** {audio_s:.2f} s"]
    if rtf:
        parts.append(f"**Real-time factor** {rtf:.3f} ({1 / rtf:.1f}x real time)")
    if ttfa_s is not None:
        parts.append(f"**Time to first audio** {ttfa_s * 1000:.0f} ms")
    if seed is not None:
        parts.append(f"**Seed** {seed}")
    return " · ".join(parts)


def shortened(text: str, limit: int = 80) -> str:
    """A text as a table shows it: long ones cut, so that the columns after it stay in view."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _safe_name(text: str, limit: int = 32) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:limit] or "audio"
    return f"{name}_" if is_windows_device_name(name) else name  # "Con.wav" would open the console there


def voice_label(voice: str | None) -> str:
    if not voice or voice == NO_VOICE:
        return "the default voice (no reference)"
    if voice == UPLOADED:
        return "the clip in the Voice clone tab (not saved)"
    return f"saved voice “{voice}”"


def speaking_in(voice: str | None) -> str:
    return f"Speaking in {voice_label(voice)}"


class Handlers:
    def __init__(self, synth: SpeechService, settings: AppSettings, outputs: OutputDir | None = None):
        self.synth = synth
        self.settings = settings
        self.outputs = outputs or OutputDir()
        self.formats = available_formats()

    @property
    def voices(self):
        return self.synth.engine.voices

    @property
    def max_text_length(self) -> int:
        """Characters per request; 0 = no limit."""
        return self.synth.max_text_length

    @property
    def max_reference_seconds(self) -> float | None:
        return getattr(getattr(self.synth.engine, "config", None), "max_reference_seconds", None)

    # ----- voices -----

    @staticmethod
    def voice_choices(voices: list[str]) -> list[tuple[str, str]]:
        """What a voice picker offers: the model's own voice, the clip in the Voice clone tab, `voices`."""
        return [(NO_VOICE_LABEL, NO_VOICE), (UPLOADED_LABEL, UPLOADED)] + [(v, v) for v in voices]

    def resolve_voice(self, voice: str | None, reference_audio: str | None, reference_text: str | None) -> Voice:
        if not voice or voice == NO_VOICE:
            return Voice()
        if voice == UPLOADED:
            return Voice(references=(self._reference(reference_audio, reference_text),))
        return Voice(voice_id=voice)

    def clip_report(self, reference_audio: str | None):
        return check_clip(reference_audio, self.max_reference_seconds)

    def _reference(self, ref_audio: str | None, ref_text: str | None, *, for_saving: bool = False) -> ReferenceInput:
        report = self.clip_report(ref_audio)
        if report is None:
            raise InputError("upload or record a reference clip in the Voice clone tab first")
        if report.error:
            raise InputError(report.error)
        if for_saving and report.too_short:
            raise InputError(
                f"the clip is {report.seconds:.1f} s long; a saved voice needs at least {MIN_VOICE_SECONDS:g} s "
                "of speech. Record or upload a longer clip"
            )
        if not (ref_text or "").strip():
            raise InputError("type the transcript of the reference clip: the model needs to know what it says")
        return ReferenceInput(audio=ref_audio, text=ref_text.strip())

    def saved_voices_table(self) -> list[list[str]]:
        """Every saved voice and the transcript of its clip."""
        rows = []
        for voice_id in sorted(self.voices.list()):
            _, transcript = self.voices.get(voice_id)
            rows.append([voice_id, transcript])
        return rows

    def save_voice(self, name: str, reference_audio: str | None = None, reference_text: str | None = None) -> str:
        """Saves the clip and its transcript under `name`; the voice is then usable everywhere."""
        name = (name or "").strip()
        if not name:
            raise InputError("give the voice a name")
        reference = self._reference(reference_audio, reference_text, for_saving=True)
        self.voices.add(name, reference.audio, reference.text)
        return f"Saved voice **{name}**."

    def rename_voice(self, old: str | None, new: str | None = None) -> str:
        """Renames a saved voice."""
        if not old:
            raise InputError("pick a saved voice to rename")
        new = (new or "").strip()
        if not new:
            raise InputError("type the new name")
        if new == old:
            raise InputError(f"{old} already has that name: type another one")
        self.voices.rename(old, new)
        return f"Renamed **{old}** to **{new}**."

    def delete_voice(self, name: str | None) -> str:
        """Deletes a saved voice."""
        if not name:
            raise InputError("pick a saved voice to delete")
        self.voices.delete(name)
        return f"Deleted **{name}**."

    def voice_sample(self, name: str | None):
        """The saved clip as samples: its file lives in the voices folder, which Gradio does not serve."""
        if not name or not self.voices.exists(name):
            return None
        path, _ = self.voices.get(name)
        return self.synth.sample_rate, to_int16(load_audio(str(path)))

    # ----- speech -----

    def _request(self, text, voice, reference_audio, reference_text, sampling) -> tuple[Voice, SamplingParams, int]:
        limit = self.max_text_length
        if text and limit and len(text) > limit:
            raise InputError(
                f"the text is {len(text):,} characters; the limit is {limit:,}. Shorten it, or put one "
                "paragraph per line in the Batch tab"
            )
        speaker = self.resolve_voice(voice, reference_audio, reference_text)
        *rest, seed = sampling
        seed = concrete_seed(seed)
        return speaker, sampling_params(*rest, seed), seed

    def _output_file(self, text: str, audio: np.ndarray, fmt: str):
        if fmt not in self.formats:
            raise InputError(f"the format {fmt!r} is not available here; choose one of {', '.join(self.formats)}")
        run = self.outputs.new_run()
        return write_file(run, f"{_safe_name(text)}.{fmt}", encode_audio(audio, self.synth.sample_rate, fmt))

    # The parameter names are the API's argument names (gradio_client, /gradio_api/call); a default
    # of None makes a parameter optional for gradio_client.
    def speak(
        self, text, voice=NO_VOICE, output_format="wav", reference_audio=None, reference_text=None,
        temperature=DEFAULTS.temperature, top_p=DEFAULTS.top_p, repetition_penalty=DEFAULTS.repetition_penalty,
        max_new_tokens=DEFAULTS.max_new_tokens, chunk_length=DEFAULTS.chunk_length, seed=DEFAULTS.seed,
    ):
        """Speaks `text`; returns (audio file in `output_format`, stats)."""
        sampling = (temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed)
        speaker, params, seed = self._request(text, voice, reference_audio, reference_text, sampling)
        result = self.synth.synthesize(text, speaker, params)
        s = result.stats
        path = self._output_file(text, result.audio, output_format or "wav")
        audio_s = len(result.audio) / result.sample_rate
        return str(path), stats_markdown(audio_s, s.get("rtf"), s.get("ttfa_s"), seed)

    def speak_stream(
        self, text, voice=NO_VOICE, output_format="wav", reference_audio=None, reference_text=None,
        temperature=DEFAULTS.temperature, top_p=DEFAULTS.top_p, repetition_penalty=DEFAULTS.repetition_penalty,
        max_new_tokens=DEFAULTS.max_new_tokens, chunk_length=DEFAULTS.chunk_length, seed=DEFAULTS.seed,
    ):
        """Speaks `text` as it is generated: yields (audio so far, then the audio file in
        `output_format`, stats). The stream is Gradio's HLS playlist when ffmpeg is there; without
        it the audio comes at the end, and the stats say how far it got meanwhile."""
        # Chunks go out as int16: Gradio peak-normalizes each float chunk on its own.
        sampling = (temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed)
        speaker, params, seed = self._request(text, voice, reference_audio, reference_text, sampling)
        stats = StreamStats(self.synth.sample_rate)
        sr = self.synth.sample_rate
        stream = self.settings.stream_ui_audio
        made: list[np.ndarray] = []
        pending: list[np.ndarray] = []
        for chunk in self.synth.stream(text, speaker, params, stats):
            made.append(chunk)
            pending.append(chunk)
            if not stream:  # the audio comes whole at the end: how far it got meanwhile
                yield gr.skip(), gr.skip(), f"Generating… {stats.audio_s:.1f} s of audio so far", gr.skip()
            elif len(made) == 1 or sum(map(len, pending)) >= MIN_STREAM_CHUNK_S * sr:
                yield (sr, to_int16(np.concatenate(pending))), gr.skip(), gr.skip(), gr.skip()
                pending = []
        if not made:
            raise InputError("the model produced no audio for this text; try a longer sentence")
        audio = np.concatenate(made)
        if stream:
            final = (sr, to_int16(np.concatenate(pending))) if pending else gr.skip()
        else:
            final = (sr, to_int16(audio))
        path = self._output_file(text, audio, output_format or "wav")
        entry = {
            "id": path.parent.name,
            "file": f"{path.parent.name}/{path.name}",
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "text": text,
            "voice": voice or NO_VOICE,
            "clip": clip_fingerprint(reference_audio, reference_text) if voice == UPLOADED else None,
            "format": output_format or "wav",
            "seconds": round(stats.audio_s, 2),
            "sampling": dict(zip(SAMPLING_NAMES, (*[float(v) for v in sampling[:3]], int(sampling[3]),
                                                  int(sampling[4]), seed))),
        }
        yield (
            final, str(path),
            stats_markdown(stats.audio_s, stats.rtf, stats.ttfa_s, seed), entry,
        )

    def preview(
        self, reference_audio, reference_text, preview_text=None,
        temperature=DEFAULTS.temperature, top_p=DEFAULTS.top_p, repetition_penalty=DEFAULTS.repetition_penalty,
        max_new_tokens=DEFAULTS.max_new_tokens, chunk_length=DEFAULTS.chunk_length, seed=DEFAULTS.seed,
    ):
        """Speaks `preview_text` in the voice of the clip, without saving it."""
        voice = Voice(references=(self._reference(reference_audio, reference_text),))
        seed = concrete_seed(seed)
        params = sampling_params(temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed)
        result = self.synth.synthesize(preview_text or "Hello! This is how the cloned voice sounds.", voice, params)
        return result.sample_rate, to_int16(result.audio)

    def batch(
        self, lines, upload=None, voice=NO_VOICE, output_format="wav", reference_audio=None, reference_text=None,
        temperature=DEFAULTS.temperature, top_p=DEFAULTS.top_p, repetition_penalty=DEFAULTS.repetition_penalty,
        max_new_tokens=DEFAULTS.max_new_tokens, chunk_length=DEFAULTS.chunk_length, seed=DEFAULTS.seed,
        progress=gr.Progress(),
    ):
        """Speaks each line (or each row of an uploaded .txt/.csv); returns (results table, zip of the
        files, each item's file for playback)."""
        texts = batch_texts(lines, upload, self.settings.max_batch_items)
        speaker = self.resolve_voice(voice, reference_audio, reference_text)
        fmt = output_format or "wav"
        if fmt not in self.formats:
            raise InputError(f"the format {fmt!r} is not available here; choose one of {', '.join(self.formats)}")
        params = sampling_params(
            temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, concrete_seed(seed)
        )
        progress((0, len(texts)), desc="Generating", unit="texts")
        results = self.synth.batch(
            texts, speaker, params,
            progress=lambda done, total: progress((done, total), desc="Generating", unit="texts"),
        )
        run = self.outputs.new_run()
        rows, paths = [], []
        for i, (text, result) in enumerate(zip(texts, results, strict=True), start=1):
            if isinstance(result, SynthesisResult):
                data = encode_audio(result.audio, result.sample_rate, fmt)
                path = write_file(run, f"{i:03d}_{_safe_name(text)}.{fmt}", data)
                rows.append([i, shortened(text), "ok", round(len(result.audio) / result.sample_rate, 2)])
                paths.append(path)
            else:
                rows.append([i, shortened(text), f"error: {problem_for(result).message}", 0.0])
                paths.append(None)
        done = [p for p in paths if p]
        archive = str(zip_files(done, run / "batch.zip")) if done else None
        return rows, archive, [str(p) if p else None for p in paths]

    @staticmethod
    def batch_item(paths: list[str | None], evt: gr.SelectData) -> str | None:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not paths or row is None or row >= len(paths) or paths[row] is None:
            return None
        return paths[row]

    # ----- history (kept in the browser) -----

    @staticmethod
    def history_table(history: list[dict] | None) -> list[list]:
        return [
            [e["time"], shortened(e["text"]), voice_label(e["voice"]).replace(" (no reference)", ""), e["format"],
             e["sampling"]["seed"], e["seconds"]]
            for e in history or []
        ]

    @staticmethod
    def add_to_history(history: list[dict] | None, entry: dict | None) -> list[dict]:
        history = list(history or [])
        if entry and not any(e.get("id") == entry["id"] for e in history):
            history.insert(0, entry)
        return history[:HISTORY_LIMIT]

    def history_file(self, history: list[dict] | None, index: int | None) -> str:
        """The file of a history entry, if the server still has it (outputs are kept an hour)."""
        entry = _entry(history, index)
        path = self.outputs.resolve(entry["file"])
        if path is None:
            raise InputError(
                "this audio is no longer on the server (files are kept for an hour); "
                "Regenerate makes it again with the same settings and seed"
            )
        return str(path)

    @staticmethod
    def history_id(history: list[dict] | None, index: int | None) -> str:
        """The id of the entry in row `index`: what stays picked while new entries push it down."""
        return _entry(history, index)["id"]

    @staticmethod
    def regeneration(history: list[dict] | None, entry_id: str | None, clip: str | None, transcript: str | None) -> dict:
        """The picked entry, if it can be made again: one spoken in an unsaved clip needs that clip
        and transcript still in the Voice clone tab."""
        entry = next((e for e in history or [] if entry_id is not None and e.get("id") == entry_id), None)
        if entry is None:
            raise InputError("pick a generation in the history table first")
        if entry["voice"] == UPLOADED and entry.get("clip") != clip_fingerprint(clip, transcript):
            raise InputError("this generation spoke in a clip of the Voice clone tab that is no longer there "
                             "(another clip or transcript is loaded): load that clip again, or save a voice "
                             "to regenerate in it later")
        return entry

    # ----- system -----

    def system_markdown(self) -> str:
        """The engine's state: device, memory, queue, throughput."""
        rows = system_rows(self.synth.engine.stats(), bool(getattr(self.synth.engine, "is_ready", False)))
        return "| Engine | Now |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def clip_fingerprint(path: str | None, transcript: str | None) -> str | None:
    """What identifies an unsaved reference: its audio's bytes and its transcript."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read())
    except OSError:
        return None
    digest.update((transcript or "").strip().encode())
    return digest.hexdigest()


def _entry(history: list[dict] | None, index: int | None) -> dict:
    if index is None or not history or not 0 <= index < len(history):
        raise InputError("pick a generation in the history table first")
    return history[index]


def system_rows(stats: dict, ready: bool) -> list[tuple[str, object]]:
    s = stats
    on_cuda = str(s.get("device") or "").startswith("cuda")

    def gb(v):
        if v is not None:
            return f"{v:.2f} GB"
        return "n/a (measured on CUDA GPUs only)" if not on_cuda else "n/a"

    running = f"{s.get('running')} of {s.get('slots')} at once (continuous batching)"
    if s.get("slots_ready") is not None and s["slots_ready"] < s.get("slots", 0):
        running += (f"; {s['slots_ready']} so far, while the larger batches' graphs are captured" if s.get("capturing")
                    else f"; {s['slots_ready']} only: capturing a larger batch's graphs failed (see the log)")
    return [
        ("Model", s.get("model")),
        ("Device", s.get("device")),
        ("Precision", s.get("precision")),
        ("Compile", s.get("compile")),
        ("Memory in use", gb(s.get("memory_gb"))),
        ("Peak memory", gb(s.get("peak_memory_gb"))),
        ("Queue depth", s.get("queue_depth")),
        ("Running", running),
        ("Voice prefixes reused", (s.get("prefix_cache") or {}).get("hits")),
        ("Frames/s (last request)", f"{s.get('frames_per_s') or 0:.1f}"),
        ("Requests served", s.get("requests_total")),
        ("Ready", "yes" if ready else "warming up"),
    ]
