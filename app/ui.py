"""The Gradio Blocks app: Speak, Voice clone, Batch, History, Advanced settings, System.

Public event names (api_name) are a stable contract for gradio_client: speak (the whole file),
speak_stream (audio as it is made, then the file), preview_voice, save_voice, rename_voice,
delete_voice, list_voices, batch, system. They hang on a hidden trigger
and raise errors; the page's own events are private and show errors next to their controls.

With an API key, the page's config (readable before login, through window.gradio_api_info) holds
no voice names: the dropdowns are filled by a load event after login. Without a key, the config
lists the saved voices and is republished when they change, so that the API schema shows them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from pathlib import Path

import gradio as gr

from engine import params as P

from .metrics import Metrics
from .settings import AppSettings
from .speech import SpeechService
from .ui_errors import api_endpoint, error_box, ui_action
from .ui_handlers import (
    BATCH_HEADERS,
    DEFAULTS,
    HISTORY_HEADERS,
    NO_VOICE,
    SAMPLING_NAMES,
    Handlers,
    speaking_in,
)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "style.css"
EXAMPLES_PATH = ASSETS / "examples.txt"
KEYS_JS_PATH = ASSETS / "keys.js"

# The random demo model never ends a sentence, so "no limit" would run to the end of its context.
DEMO_MAX_NEW_TOKENS = 128
# The history lives in the browser's localStorage. It holds only what this browser generated, so
# its encryption key needs no secrecy; a fixed one keeps the history across server restarts.
HISTORY_STORAGE_KEY = "s1-mini-studio-history"
HISTORY_STORAGE_SECRET = "s1-mini-studio-history"

# The character counter under the text box: code points, as the server counts (len in Python).
COUNTER_JS = """(text) => {
  const n = [...(text || '')].length, limit = %d;
  if (!limit) return `${n.toLocaleString('en')} characters`;
  const over = n > limit;
  const count = `${n.toLocaleString('en')} / ${limit.toLocaleString('en')} characters`;
  return over ? `<span class="over">${count} (over the limit: shorten the text, or use Batch)</span>` : count;
}"""
# What cannot be undone asks first (the browser's own dialog); the answer goes to a hidden checkbox
# that the server's step reads. Nothing picked: no question, the server says what is missing.
CONFIRM_DELETE_JS = """(name) => !name || confirm(`Delete the saved voice “${name}”? This cannot be undone.`)"""
CONFIRM_CLEAR_JS = """() => confirm("Clear this browser's history of generations? This cannot be undone.")"""


def confirmed(fn, outputs: int):
    """fn behind a yes/no answer, its first argument: without a yes, its `outputs` stay as they are."""

    def run(answer, *args):
        return fn(*args) if answer else tuple(gr.skip() for _ in range(outputs))

    return run


def _within(engine_range, ui_range):
    """The reference UI's slider range, kept inside what the engine accepts."""
    return max(engine_range[0], ui_range[0]), min(engine_range[1], ui_range[1])


# Ranges and defaults of the reference web UI (fish-speech tools/webui), one hint each.
def _sampling_controls(max_new_tokens: int) -> list[gr.components.Component]:
    def slider(name, label, engine_range, ui_range, step, value, info):
        low, high = _within(engine_range, ui_range)
        return gr.Slider(low, high, value=value, step=step, label=label, info=info, elem_id=f"set-{name}")

    d = DEFAULTS
    return [
        slider("temperature", "Temperature", P.TEMPERATURE_RANGE, (0.7, 1.0), 0.01, d.temperature,
               "Higher sounds livelier and more varied; lower is steadier."),
        slider("top_p", "Top-P", P.TOP_P_RANGE, (0.7, 0.95), 0.01, d.top_p,
               "Picks only among the likeliest sounds; lower is safer, higher more diverse."),
        slider("repetition_penalty", "Repetition penalty", P.REPETITION_PENALTY_RANGE, (1.0, 1.2), 0.01,
               d.repetition_penalty, "Above 1 discourages repeated sounds and stuck loops."),
        slider("max_new_tokens", "Maximum new tokens", P.MAX_NEW_TOKENS_RANGE, (0, 2048), 8, max_new_tokens,
               "Caps the audio frames per text chunk (about 21.5 per second); 0 = no cap."),
        slider("chunk_length", "Chunk length", P.CHUNK_LENGTH_RANGE, (100, 400), 8, d.chunk_length,
               "Characters spoken per step; long texts are split at sentence ends."),
        gr.Number(
            # No minimum/maximum here: Gradio would refuse a value out of range with a bare toast;
            # the handlers say what is wrong next to the button that ran (concrete_seed).
            label="Seed", value=d.seed, precision=0,
            info="The same seed and settings give the same audio; 0 = a new seed each time (shown in the stats).",
            elem_id="set-seed",
        ),
    ]


def _examples() -> list[list[str]]:
    if not EXAMPLES_PATH.is_file():
        return []
    return [[line] for line in EXAMPLES_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]


class VoiceChoices:
    """Keeps the voice pickers' choices in the page config in step with the saved voices (no key only)."""

    def __init__(self, demo: gr.Blocks, handlers: Handlers, pickers: list[gr.Dropdown], managed: gr.Dropdown):
        self.demo, self.h, self.pickers, self.managed = demo, handlers, pickers, managed
        self._lock = threading.Lock()
        self._published: list[str] | None = None

    def initial(self, public: bool) -> tuple[list, list]:
        ids = sorted(self.h.voices.list()) if public else []
        self._published = ids if public else None
        return self.h.voice_choices(voices=ids), ids

    def publish(self):
        """New choices into the config, and the cached API info dropped, when the voices changed."""
        if self._published is None:
            return
        with self._lock:
            ids = sorted(self.h.voices.list())
            if ids == self._published:
                return
            for picker in self.pickers:
                picker.choices = self.h.voice_choices(voices=ids)
            self.managed.choices = [(i, i) for i in ids]
            self.demo.config = self.demo.get_config_file()
            app = getattr(self.demo._queue, "server_app", None)
            if app is not None:
                app.api_info = None
                app.all_app_info = None
                app.page_api_info.clear()
            self._published = ids


def build_ui(synth: SpeechService, settings: AppSettings, metrics: Metrics) -> gr.Blocks:
    h = Handlers(synth, settings)
    public = settings.api_key is None
    demo_mode = bool(synth.engine.stats().get("demo"))
    limit = h.max_text_length

    def ui(fn, name, outputs, status_first=False):
        return ui_action(fn, f"ui/{name}", metrics, outputs, status_first=status_first)

    def api(fn, name):
        return api_endpoint(fn, f"ui/{name}", metrics)

    def errors(elem_id):
        return gr.Markdown(visible=False, elem_id=elem_id, elem_classes=["error-box"])

    # Voices come and go while the page is open, so a value outside the choices must be accepted
    # (API callers name voices saved later); the engine rejects unknown ones clearly.
    def voice_dropdown(elem_id, choices):
        return gr.Dropdown(
            choices, value=NO_VOICE, label="Voice", elem_id=elem_id, allow_custom_value=True, scale=3, min_width=180
        )

    def format_dropdown(elem_id):
        return gr.Dropdown(
            h.formats, value="wav", label="Format", elem_id=elem_id, scale=1, min_width=90,
            info=None if "mp3" in h.formats else "mp3 and opus need ffmpeg",
        )

    with gr.Blocks(title=settings.title, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {settings.title}\nText to speech with OpenAudio S1-mini.", elem_id="title")
        if demo_mode:
            gr.Markdown(
                "**Demo mode:** a tiny model with random weights is loaded, so the audio is noise, "
                f"{DEMO_MAX_NEW_TOKENS} frames at most by default. "
                "Start without `--demo` to load the real checkpoint (`fishaudio/openaudio-s1-mini`, gated on "
                "Hugging Face: accept its licence there and set `HF_TOKEN`, or download it into "
                "`checkpoints/openaudio-s1-mini`).",
                elem_id="demo-notice",
            )
        api_trigger = gr.Button(visible=False, elem_id="api-only")
        history = gr.BrowserState([], storage_key=HISTORY_STORAGE_KEY, secret=HISTORY_STORAGE_SECRET)

        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Speak", id="speak", elem_id="speak-panel"):
                text = gr.Textbox(label="Text", lines=6, max_lines=20, placeholder="Type what to say…",
                                  elem_id="speak-text")
                counter = gr.HTML(f"0 / {limit:,} characters" if limit else "0 characters", elem_id="char-count")
                with gr.Row(equal_height=True, elem_id="speak-controls"):
                    voice = voice_dropdown("speak-voice", [])
                    output_format = format_dropdown("speak-format")
                    generate = gr.Button("Generate", variant="primary", elem_id="generate", scale=0, min_width=140)
                    stop = gr.Button("Stop", variant="stop", elem_id="stop", scale=0, min_width=100, visible=False)
                indicator = gr.Markdown(speaking_in(NO_VOICE), elem_id="voice-indicator")
                speak_error = errors("speak-error")
                if settings.stream_ui_audio:
                    audio = gr.Audio(
                        label="Speech", streaming=True, autoplay=True, interactive=False, elem_id="speak-audio"
                    )
                else:
                    audio = gr.Audio(label="Speech", interactive=False, elem_id="speak-audio")
                    gr.Markdown("ffmpeg was not found, so audio plays when it is complete instead of streaming.")
                with gr.Row(equal_height=False, elem_id="speak-result"):
                    download = gr.File(label="Download", interactive=False, visible=False, elem_id="speak-download",
                                       height=80)
                    stats = gr.Markdown(label="Stats", elem_id="speak-stats")
                gr.Markdown("Ctrl+Enter (⌘+Enter on a Mac) in a text box runs its tab's button: here, Generate.",
                            elem_classes=["hint"])
                last_entry = gr.State(None)
                examples = _examples()
                if examples:
                    gr.Examples(examples, inputs=[text], label="Examples")

            with gr.Tab("Voice clone", id="clone", elem_id="clone-panel"):
                with gr.Row():
                    with gr.Column(min_width=300):
                        ref_audio = gr.Audio(
                            sources=["upload", "microphone"], type="filepath",
                            label="Reference clip (5-15 s of clear speech)", elem_id="ref-audio",
                        )
                        clip_status = gr.Markdown(visible=False, elem_id="clip-check")
                        ref_text = gr.Textbox(label="Transcript of the clip", lines=2, elem_id="ref-text",
                                              placeholder="Exactly what is said in the clip")
                        preview_text = gr.Textbox(
                            label="Preview text", value="Hello! This is how the cloned voice sounds.", lines=2,
                            elem_id="preview-text",
                        )
                        preview_btn = gr.Button("Preview", elem_id="preview")
                        preview_error = errors("preview-error")
                        preview_audio = gr.Audio(label="Preview", interactive=False, elem_id="preview-audio")
                        with gr.Row(equal_height=True):
                            new_name = gr.Textbox(label="Save as", placeholder="voice name", elem_id="voice-name",
                                                  scale=3, min_width=160)
                            save_btn = gr.Button("Save voice", variant="primary", scale=0, min_width=150,
                                                 elem_id="save-voice")
                        save_status = gr.Markdown(label="Status", elem_id="save-status")
                        save_error = errors("save-error")
                    with gr.Column(min_width=300):
                        saved = gr.Dataframe(
                            headers=["voice", "transcript"], label="Saved voices", interactive=False,
                            elem_id="saved-voices", max_height=300,
                        )
                        picked = gr.Dropdown([], value=None, label="Saved voice", allow_custom_value=True,
                                             elem_id="picked-voice")
                        picked_audio = gr.Audio(label="Its reference clip", interactive=False, elem_id="picked-audio")
                        with gr.Row(equal_height=True):
                            rename_to = gr.Textbox(label="Rename to", elem_id="rename-to", scale=3, min_width=160)
                            rename_btn = gr.Button("Rename", scale=0, min_width=90, elem_id="rename")
                            delete_btn = gr.Button("Delete", variant="stop", scale=0, min_width=90, elem_id="delete")
                        manage_status = gr.Markdown(label="Status", elem_id="manage-status")
                        manage_error = errors("manage-error")

            with gr.Tab("Batch", id="batch", elem_id="batch-panel"):
                with gr.Row():
                    lines = gr.Textbox(label="One text per line", lines=8, elem_id="batch-lines", min_width=280)
                    upload = gr.File(label="…or a .txt / .csv file", file_types=[".txt", ".csv"], type="filepath",
                                     elem_id="batch-upload", min_width=280)
                with gr.Row(equal_height=True, elem_id="batch-controls"):
                    batch_voice = voice_dropdown("batch-voice", [])
                    batch_format = format_dropdown("batch-format")
                    batch_btn = gr.Button("Generate all", variant="primary", scale=0, min_width=160,
                                          elem_id="batch-run")
                batch_error = errors("batch-error")
                table = gr.Dataframe(
                    headers=BATCH_HEADERS, label="Results (click a row to play it)", interactive=False,
                    elem_id="batch-table", max_height=400,
                )
                item_audio = gr.Audio(label="Selected item", interactive=False, elem_id="batch-item")
                archive = gr.File(label="All files (zip)", interactive=False, visible=False, elem_id="batch-zip",
                                  height=80)
                item_paths = gr.State([])

            with gr.Tab("History", id="history", elem_id="history-panel"):
                gr.Markdown("Your generations in this browser (kept on this device, newest first). "
                            "Click one to play or download it.", elem_classes=["hint"])
                history_table = gr.Dataframe(
                    headers=HISTORY_HEADERS, interactive=False, elem_id="history-table", max_height=400,
                    label="History",
                )
                history_pick = gr.State(None)  # the picked entry's id: rows move as entries are added
                settings_before = gr.State(None)  # Advanced settings as they were before a Regenerate
                regenerating = gr.State(None)  # the entry a Regenerate makes again, None if it cannot
                with gr.Row(equal_height=False):
                    history_audio = gr.Audio(label="Selected generation", interactive=False, elem_id="history-audio")
                    history_download = gr.File(label="Download", interactive=False, visible=False,
                                               elem_id="history-download", height=80)
                with gr.Row():
                    regenerate = gr.Button("Regenerate (same settings and seed)", interactive=False,
                                           elem_id="regenerate", scale=0, min_width=380)
                    clear_history = gr.Button("Clear history", variant="stop", scale=0, min_width=160,
                                              elem_id="clear-history")
                history_error = errors("history-error")

            with gr.Tab("Advanced settings", id="settings", elem_id="settings-panel"):
                gr.Markdown("Used by Speak, Preview and Batch. Ranges and defaults follow the reference "
                            "fish-speech web UI.", elem_classes=["hint"])
                sampling = _sampling_controls(DEMO_MAX_NEW_TOKENS if demo_mode else DEFAULTS.max_new_tokens)

            with gr.Tab("System", id="system", elem_id="system-panel"):
                system = gr.Markdown("Loading…", label="System", elem_id="system-stats")
                refresh = gr.Button("Refresh", scale=0, min_width=120, elem_id="system-refresh")
                gr.Timer(5).tick(
                    h.system_markdown, outputs=system, queue=False, show_progress="hidden", api_visibility="private"
                )

        choices = VoiceChoices(demo, h, [voice, batch_voice], picked)
        voice_list, ids = choices.initial(public)
        for dropdown in (voice, batch_voice):
            dropdown.choices = voice_list
        picked.choices = [(i, i) for i in ids]

        # ----- voices: keep every picker in step -----

        def voice_updates(speak_value, batch_value, picked_value):
            """Choices everywhere a voice is picked; a selection that no longer exists falls back."""
            ids = sorted(synth.engine.voices.list())
            options = h.voice_choices(voices=ids)
            values = {value for _, value in options}
            choices.publish()

            def keep(current):
                return current if current in values else NO_VOICE

            return (
                gr.Dropdown(choices=options, value=keep(speak_value)),
                gr.Dropdown(choices=options, value=keep(batch_value)),
                gr.Dropdown(choices=ids, value=picked_value if picked_value in ids else None),
                h.saved_voices_table(),
            )

        def save_in_ui(name, clip, transcript, speak_value, batch_value):
            status = h.save_voice(name, clip, transcript)
            name = name.strip()
            return f"{status} Speak now uses it.", *voice_updates(name, batch_value, name)  # the page's Speak alone

        def rename_in_ui(old, new, speak_value, batch_value):
            status = h.rename_voice(old, new)
            new = new.strip()
            moved = lambda v: new if v == old else v  # noqa: E731
            return status, *voice_updates(moved(speak_value), moved(batch_value), new)

        def delete_in_ui(name, speak_value, batch_value):
            status = h.delete_voice(name)
            return status, *voice_updates(speak_value, batch_value, None)

        voice_outputs = [voice, batch_voice, picked, saved]
        for button, fn, inputs, status, error, name in (
            (save_btn, save_in_ui, [new_name, ref_audio, ref_text], save_status, save_error, "save_voice"),
            (rename_btn, rename_in_ui, [picked, rename_to], manage_status, manage_error, "rename_voice"),
        ):
            button.click(
                ui(fn, name, 5, status_first=True), [*inputs, voice, batch_voice], [status, *voice_outputs, error],
                api_visibility="private",
            )
        delete_confirmed = gr.Checkbox(visible=False)
        delete_btn.click(None, picked, delete_confirmed, js=CONFIRM_DELETE_JS, api_visibility="private").then(
            confirmed(ui(delete_in_ui, "delete_voice", 5, status_first=True), outputs=6),
            [delete_confirmed, picked, voice, batch_voice], [manage_status, *voice_outputs, manage_error],
            api_visibility="private",
        )

        def api_voice_change(fn):
            @functools.wraps(fn)  # the API's parameter names and description are `fn`'s
            def changed(*args):
                result = fn(*args)
                choices.publish()
                return result

            return changed

        api_trigger.click(api(api_voice_change(h.save_voice), "save_voice"), [new_name, ref_audio, ref_text],
                          save_status, api_name="save_voice")
        api_trigger.click(api(api_voice_change(h.rename_voice), "rename_voice"), [picked, rename_to], manage_status,
                          api_name="rename_voice")
        api_trigger.click(api(api_voice_change(h.delete_voice), "delete_voice"), [picked], manage_status,
                          api_name="delete_voice")
        gr.api(h.saved_voices_table, api_name="list_voices")

        picked.change(h.voice_sample, picked, picked_audio, api_visibility="private", show_progress="hidden")

        def pick_saved(evt: gr.SelectData):
            """A click on a saved voice's row picks it, as the dropdown does."""
            return evt.row_value[0] if evt.row_value else gr.skip()

        saved.select(pick_saved, None, picked, api_visibility="private", show_progress="hidden")
        voice.change(speaking_in, voice, indicator, queue=False, show_progress="hidden", api_visibility="private")

        def clip_checked(clip):
            report = h.clip_report(clip)
            return gr.Markdown(value=report.markdown() if report else "", visible=report is not None)

        ref_audio.change(clip_checked, ref_audio, clip_status, api_visibility="private")

        # ----- speech -----

        engine_slot = {"concurrency_limit": settings.ui_concurrency, "concurrency_id": "engine"}
        speak_inputs = [text, voice, output_format, ref_audio, ref_text, *sampling]
        speak_outputs = [audio, download, stats, last_entry]

        def remember(entries, entry):
            entries = h.add_to_history(entries, entry)
            return entries, h.history_table(entries)

        # While a text is spoken, Generate says so and takes no other click (Gradio would drop it),
        # and Stop ends the run between two chunks: the engine frees its slot, what was spoken so far
        # stays playable, nothing goes to the history. (Gradio's own cancelling can leave an error
        # mark on the audio.) Pages are told apart by their session.
        stop_asked: set[str] = set()
        speaking: set[str] = set()  # pages with a run in progress

        def speak_in_page(session: str, *args):
            """The download box appears with the run's file. The last run's file goes when this run's
            audio starts to play, not before: a text refused at once leaves the last audio and file."""
            try:
                with contextlib.closing(h.speak_stream(*args)) as chunks:
                    for i, (played, file, shown, entry) in enumerate(chunks):
                        if session in stop_asked:
                            yield gr.skip(), gr.skip(), "Stopped.", gr.skip()
                            return
                        if isinstance(file, str):
                            file = gr.File(value=file, visible=True)
                        elif i == 0:
                            file = gr.File(value=None, visible=False)
                        yield played, file, shown, entry
            finally:
                stop_asked.discard(session)

        def busy(request: gr.Request):
            stop_asked.discard(request.session_hash)  # a Stop that came after the last run ended is not for this one
            speaking.add(request.session_hash)
            # Regenerate would start a second run beside this one, which Stop could then not reach.
            return (gr.Button("Generating…", interactive=False), gr.Button("Stop", visible=True, interactive=True),
                    gr.Button(interactive=False))

        def idle(picked_entry, request: gr.Request):
            speaking.discard(request.session_hash)
            return gr.Button("Generate", interactive=True), gr.Button(visible=False), gr.Button(
                interactive=picked_entry is not None)

        def ask_to_stop(request: gr.Request):
            stop_asked.add(request.session_hash)
            return gr.Button("Stopping…", interactive=False)

        speak_with_errors = ui(speak_in_page, "speak", 4)

        def speak_for_page(request: gr.Request, *args):  # Gradio passes the request where it is declared
            yield from speak_with_errors(request.session_hash, *args)

        def speak_in_ui(trigger_event, before_idle=lambda run: run):
            """trigger_event(fn, inputs, outputs, **kw) starts the run: Generate's click, or the end of
            Regenerate's checks. before_idle(run) chains what must be done before the buttons take
            clicks again (Regenerate gives the settings back: a click sooner would take the run's)."""
            run = trigger_event(
                busy, None, [generate, stop, regenerate], queue=False, api_visibility="private", show_progress="hidden",
            ).then(
                speak_for_page, speak_inputs, [*speak_outputs, speak_error],
                api_visibility="private", show_progress_on=[audio], **engine_slot,
            ).then(remember, [history, last_entry], [history, history_table], api_visibility="private",
                   show_progress="hidden")
            before_idle(run).then(idle, history_pick, [generate, stop, regenerate], api_visibility="private",
                                  show_progress="hidden")

        speak_in_ui(generate.click)
        api_trigger.click(api(h.speak, "speak"), speak_inputs, [download, stats], api_name="speak", **engine_slot)
        api_trigger.click(
            api(h.speak_stream, "speak_stream"), speak_inputs, speak_outputs, api_name="speak_stream", **engine_slot
        )
        text.change(None, text, counter, js=COUNTER_JS % limit, queue=False, show_progress="hidden")

        preview_inputs = [ref_audio, ref_text, preview_text, *sampling]
        preview_btn.click(ui(h.preview, "preview_voice", 1), preview_inputs, [preview_audio, preview_error],
                          api_visibility="private", **engine_slot)
        api_trigger.click(api(h.preview, "preview_voice"), preview_inputs, preview_audio, api_name="preview_voice",
                          **engine_slot)

        batch_inputs = [lines, upload, batch_voice, batch_format, ref_audio, ref_text, *sampling]

        def batch_in_ui(*args):
            rows, zip_path, paths = h.batch(*args)
            return rows, gr.File(value=zip_path, visible=zip_path is not None), paths

        batch_btn.click(ui(batch_in_ui, "batch", 3), batch_inputs, [table, archive, item_paths, batch_error],
                        api_visibility="private", show_progress_on=[table], **engine_slot)
        api_trigger.click(api(h.batch, "batch"), batch_inputs, [table, archive, item_paths], api_name="batch",
                          **engine_slot)
        table.select(h.batch_item, item_paths, item_audio, api_visibility="private")

        # ----- history -----

        def pick_history(entries, evt: gr.SelectData):
            index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
            entry_id = h.history_id(entries, index) if entries and 0 <= index < len(entries) else None
            try:
                path = h.history_file(entries, index)
            except Exception as e:  # noqa: BLE001 - shown next to the table, as every UI error
                return entry_id, None, gr.File(visible=False), gr.Button(interactive=True), error_box(str(e))
            return entry_id, path, gr.File(value=path, visible=True), gr.Button(interactive=True), error_box()

        history_table.select(
            pick_history, history, [history_pick, history_audio, history_download, regenerate, history_error],
            api_visibility="private",
        )

        # Regenerate: check the entry (why not, next to the table), keep the Advanced settings, put the
        # entry's text, voice, format and settings in Speak and run it, then give the settings back:
        # its seed must not stay for the next texts.
        def check_regeneration(request: gr.Request, entries, entry_id, clip, transcript, *settings):
            if request.session_hash in speaking:  # a row picked while a run goes on enables the button
                return None, list(settings), error_box("a text is being spoken: wait for it, or Stop it in Speak, "
                                                       "then regenerate")
            try:
                entry = h.regeneration(entries, entry_id, clip, transcript)
            except Exception as e:  # noqa: BLE001 - shown next to the table, as every UI error
                return None, list(settings), error_box(str(e))
            return entry, list(settings), error_box()

        def stop_unless_regenerable(entry):
            """Ends the chain (check_regeneration showed why). It has no outputs, which would show an
            error mark of their own."""
            if entry is None:
                raise gr.Error("", visible=False, print_exception=False)

        def restore(entry):
            values = [entry["sampling"][name] for name in SAMPLING_NAMES]
            return entry["text"], entry["voice"], entry["format"], *values, gr.Tabs(selected="speak")

        def settings_back(settings):
            return tuple(settings) if settings else tuple(gr.skip() for _ in sampling)

        speak_in_ui(
            lambda fn, inputs, outputs, **kw: regenerate.click(
                check_regeneration, [history, history_pick, ref_audio, ref_text, *sampling],
                [regenerating, settings_before, history_error], api_visibility="private", show_progress="hidden",
            ).then(
                stop_unless_regenerable, regenerating, None, api_visibility="private", show_progress="hidden",
            ).success(
                restore, regenerating, [text, voice, output_format, *sampling, tabs],
                api_visibility="private", show_progress="hidden",
            ).success(fn, inputs, outputs, **kw),
            before_idle=lambda run: run.then(settings_back, settings_before, sampling, api_visibility="private",
                                             show_progress="hidden"),
        )
        stop.click(ask_to_stop, None, stop, queue=False, api_visibility="private", show_progress="hidden")

        def forget():
            return [], [], None, None, gr.File(visible=False), gr.Button(interactive=False), error_box()

        clear_confirmed = gr.Checkbox(visible=False)
        clear_history.click(
            None, None, clear_confirmed, js=CONFIRM_CLEAR_JS, api_visibility="private",
        ).then(
            confirmed(forget, outputs=7), clear_confirmed,
            [history, history_table, history_pick, history_audio, history_download, regenerate, history_error],
            api_visibility="private",
        )

        # ----- system, page load -----

        refresh.click(h.system_markdown, outputs=system, api_name="system")
        demo.load(voice_updates, [voice, batch_voice, picked], voice_outputs, api_visibility="private")
        demo.load(h.system_markdown, outputs=system, api_visibility="private", show_progress="hidden")
        demo.load(h.history_table, history, history_table, api_visibility="private", show_progress="hidden")
        if KEYS_JS_PATH.is_file():
            demo.load(None, js=KEYS_JS_PATH.read_text(encoding="utf-8"))

    demo.queue(default_concurrency_limit=settings.ui_concurrency)
    return demo
