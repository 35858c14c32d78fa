"""What the UI's buttons do. Layout and wiring are in app.ui; this module has the behaviour."""

from __future__ import annotations

import functools
import inspect
import re

import gradio as gr
import numpy as np

from engine.audio import encode_audio, to_int16
from engine.errors import InputError
from engine.facade import ReferenceInput, SynthesisResult
from engine.params import SamplingParams

from .batch_input import batch_texts
from .errors import problem_for
from .metrics import Metrics
from .outputs import OutputDir, write_file, zip_files
from .service import SpeechService, StreamStats, Voice
from .settings import AppSettings

# Dropdown values that cannot clash with a voice id (ids allow letters, digits, space, - and _).
NO_VOICE = "<none>"
UPLOADED = "<uploaded>"

# Streaming playback is smoother with chunks of a second or more (Gradio's streaming guide);
# the first chunk still goes out at once so the listener hears something early.
MIN_STREAM_CHUNK_S = 1.0

BATCH_HEADERS = ["#", "text", "status", "seconds"]


def guarded(fn, route: str, metrics: Metrics):
    """Shows errors as readable messages (never a stack trace) and counts UI requests.

    Gradio looks at the handler to decide whether it streams, so generators stay generators.
    """

    def fail(e: Exception):
        problem = problem_for(e)
        metrics.observe_request(route, problem.status, problem.kind)
        return gr.Error(problem.message)

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except Exception as e:
                raise fail(e) from None
            metrics.observe_request(route, 200)

        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as e:
            raise fail(e) from None
        metrics.observe_request(route, 200)
        return result

    return call


def sampling_params(temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed) -> SamplingParams:
    seed = int(seed or 0)
    return SamplingParams(
        temperature=float(temperature),
        top_p=float(top_p),
        repetition_penalty=float(repetition_penalty),
        max_new_tokens=int(max_new_tokens),
        chunk_length=int(chunk_length),
        seed=seed or None,  # 0 = random, as in the reference UI
    )


def stats_markdown(audio_s: float, rtf: float | None, ttfa_s: float | None) -> str:
    parts = [f"**Audio** {audio_s:.2f} s"]
    if rtf:
        parts.append(f"**Real-time factor** {rtf:.3f} ({1 / rtf:.1f}x real time)")
    if ttfa_s is not None:
        parts.append(f"**Time to first audio** {ttfa_s * 1000:.0f} ms")
    return " · ".join(parts)


def _safe_name(text: str, limit: int = 32) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:limit] or "audio"


class Handlers:
    def __init__(self, synth: SpeechService, settings: AppSettings, outputs: OutputDir | None = None):
        self.synth = synth
        self.settings = settings
        self.outputs = outputs or OutputDir()

    @property
    def voices(self):
        return self.synth.engine.voices

    # ----- voices -----

    def voice_choices(self, uploaded: bool) -> list[tuple[str, str]]:
        choices = [("Default voice (no reference)", NO_VOICE)]
        if uploaded:
            choices.append(("Uploaded reference (not saved)", UPLOADED))
        return choices + [(v, v) for v in sorted(self.voices.list())]

    def resolve_voice(self, voice: str | None, reference_audio: str | None, reference_text: str | None) -> Voice:
        if not voice or voice == NO_VOICE:
            return Voice()
        if voice == UPLOADED:
            return Voice(references=(self._reference(reference_audio, reference_text),))
        return Voice(voice_id=voice)

    @staticmethod
    def _reference(ref_audio: str | None, ref_text: str | None) -> ReferenceInput:
        if not ref_audio:
            raise InputError("upload or record a reference clip in the Voice clone tab first")
        if not (ref_text or "").strip():
            raise InputError("type the transcript of the reference clip: the model needs to know what it says")
        return ReferenceInput(audio=ref_audio, text=ref_text.strip())

    def saved_voices_table(self) -> list[list[str]]:
        rows = []
        for voice_id in sorted(self.voices.list()):
            _, transcript = self.voices.get(voice_id)
            rows.append([voice_id, transcript])
        return rows

    def save_voice(self, name: str, reference_audio: str | None, reference_text: str | None) -> str:
        name = (name or "").strip()
        if not name:
            raise InputError("give the voice a name")
        reference = self._reference(reference_audio, reference_text)
        self.voices.add(name, reference.audio, reference.text)
        return f"Saved voice **{name}**."

    def rename_voice(self, old: str | None, new: str) -> str:
        if not old:
            raise InputError("pick a saved voice to rename")
        new = (new or "").strip()
        if not new:
            raise InputError("type the new name")
        self.voices.rename(old, new)
        return f"Renamed **{old}** to **{new}**."

    def delete_voice(self, name: str | None) -> str:
        if not name:
            raise InputError("pick a saved voice to delete")
        self.voices.delete(name)
        return f"Deleted **{name}**."

    def voice_sample(self, name: str | None) -> str | None:
        if not name or not self.voices.exists(name):
            return None
        path, _ = self.voices.get(name)
        return str(path)

    # ----- speech -----

    # The parameter names are the API's argument names (gradio_client, /gradio_api/call).
    def speak(
        self, text, voice, reference_audio, reference_text,
        temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed,
    ):
        """Yields (audio, download, stats). Audio streams as it is made when ffmpeg is there.

        Chunks go out as int16: Gradio peak-normalizes each float chunk on its own.
        """
        speaker = self.resolve_voice(voice, reference_audio, reference_text)
        params = sampling_params(temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed)
        stats = StreamStats(self.synth.sample_rate)
        sr = self.synth.sample_rate
        made: list[np.ndarray] = []
        pending: list[np.ndarray] = []
        for chunk in self.synth.stream(text, speaker, params, stats):
            made.append(chunk)
            pending.append(chunk)
            first = len(made) == 1
            if self.settings.stream_ui_audio and (first or sum(map(len, pending)) >= MIN_STREAM_CHUNK_S * sr):
                yield (sr, to_int16(np.concatenate(pending))), gr.skip(), gr.skip()
                pending = []
        if not made:
            raise InputError("the model produced no audio for this text; try a longer sentence")
        audio = np.concatenate(made)
        if self.settings.stream_ui_audio:
            final = (sr, to_int16(np.concatenate(pending))) if pending else gr.skip()
        else:
            final = (sr, to_int16(audio))
        download = write_file(self.outputs.new_run(), f"{_safe_name(text)}.wav", encode_audio(audio, sr, "wav"))
        yield final, str(download), stats_markdown(stats.audio_s, stats.rtf, stats.ttfa_s)

    def preview(
        self, reference_audio, reference_text, preview_text,
        temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed,
    ):
        voice = Voice(references=(self._reference(reference_audio, reference_text),))
        params = sampling_params(temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed)
        result = self.synth.synthesize(preview_text, voice, params)
        return result.sample_rate, to_int16(result.audio)

    def batch(
        self, lines, upload, voice, reference_audio, reference_text,
        temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed,
        progress=gr.Progress(),
    ):
        """Returns (results table, zip path, item paths for playback)."""
        texts = batch_texts(lines, upload, self.settings.max_batch_items)
        speaker = self.resolve_voice(voice, reference_audio, reference_text)
        params = sampling_params(temperature, top_p, repetition_penalty, max_new_tokens, chunk_length, seed)
        progress((0, len(texts)), desc="Generating", unit="texts")
        results = self.synth.batch(
            texts, speaker, params,
            progress=lambda done, total: progress((done, total), desc="Generating", unit="texts"),
        )
        run = self.outputs.new_run()
        rows, paths = [], []
        for i, (text, result) in enumerate(zip(texts, results, strict=True), start=1):
            if isinstance(result, SynthesisResult):
                data = encode_audio(result.audio, result.sample_rate, "wav")
                path = write_file(run, f"{i:03d}_{_safe_name(text)}.wav", data)
                rows.append([i, text, "ok", round(len(result.audio) / result.sample_rate, 2)])
                paths.append(path)
            else:
                rows.append([i, text, f"error: {problem_for(result).message}", 0.0])
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

    # ----- system -----

    def system_markdown(self) -> str:
        s = self.synth.engine.stats()

        def gb(v):
            return "n/a" if v is None else f"{v:.2f} GB"

        running = f"{s.get('running')} of {s.get('slots')} at once (continuous batching)"
        if s.get("slots_ready") is not None and s["slots_ready"] < s.get("slots", 0):
            running += (f"; {s['slots_ready']} so far, while the larger batches' graphs are captured" if s.get("capturing")
                        else f"; {s['slots_ready']} only: capturing a larger batch's graphs failed (see the log)")
        rows = [
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
            ("Ready", "yes" if self.synth.engine.is_ready else "warming up"),
        ]
        return "| Engine | Now |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
