"""The Gradio Blocks app: Speak, Voice clone, Batch, Advanced settings, System.

Event names (api_name) are a stable contract for gradio_client: speak, preview_voice, save_voice,
rename_voice, delete_voice, list_voices, batch, system.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from engine import params as P
from engine.params import SamplingParams

from .metrics import Metrics
from .service import SpeechService
from .settings import AppSettings
from .ui_handlers import BATCH_HEADERS, NO_VOICE, UPLOADED, Handlers, guarded

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "style.css"
EXAMPLES_PATH = ASSETS / "examples.txt"

_DEFAULTS = SamplingParams()
# The random demo model never ends a sentence, so "no limit" would run to the end of its context.
DEMO_MAX_NEW_TOKENS = 128


def _within(engine_range, ui_range):
    """The reference UI's slider range, kept inside what the engine accepts."""
    return max(engine_range[0], ui_range[0]), min(engine_range[1], ui_range[1])


# Slider ranges of the reference web UI (fish-speech tools/webui); defaults are the engine's
# except where the reference UI differs (no token limit, chunk length 300).
def _sampling_controls(max_new_tokens: int) -> list[gr.components.Component]:
    def slider(label, engine_range, ui_range, step, value, info):
        low, high = _within(engine_range, ui_range)
        return gr.Slider(low, high, value=value, step=step, label=label, info=info)

    return [
        slider("Temperature", P.TEMPERATURE_RANGE, (0.7, 1.0), 0.01, _DEFAULTS.temperature, "Higher = more varied"),
        slider("Top-P", P.TOP_P_RANGE, (0.7, 0.95), 0.01, _DEFAULTS.top_p, "Nucleus sampling"),
        slider(
            "Repetition penalty", P.REPETITION_PENALTY_RANGE, (1.0, 1.2), 0.01, _DEFAULTS.repetition_penalty,
            "Discourages loops",
        ),
        slider(
            "Maximum new tokens", P.MAX_NEW_TOKENS_RANGE, (0, 2048), 8, max_new_tokens,
            "Frames per text chunk (21.5 per second of audio); 0 = no limit",
        ),
        slider("Chunk length", P.CHUNK_LENGTH_RANGE, (100, 400), 8, 300, "Characters of text per chunk"),
        gr.Number(
            label="Seed", value=0, precision=0, minimum=P.SEED_RANGE[0], maximum=P.SEED_RANGE[1], info="0 = random"
        ),
    ]


def _examples() -> list[list[str]]:
    if not EXAMPLES_PATH.is_file():
        return []
    return [[line] for line in EXAMPLES_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]


def build_ui(synth: SpeechService, settings: AppSettings, metrics: Metrics) -> gr.Blocks:
    h = Handlers(synth, settings)

    def event(fn, name):
        return guarded(fn, name, metrics)

    # Voices come and go while the page is open, so a value outside the initial choices must be
    # accepted (API callers name voices saved later); the engine rejects unknown ones clearly.
    def voice_dropdown(label, elem_id):
        return gr.Dropdown(
            h.voice_choices(uploaded=False), value=NO_VOICE, label=label, elem_id=elem_id, allow_custom_value=True
        )

    with gr.Blocks(title=settings.title, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {settings.title}\nText to speech with OpenAudio S1-mini.", elem_id="title")
        demo_mode = bool(synth.engine.stats().get("demo"))
        if demo_mode:
            gr.Markdown(
                "**Demo mode:** a tiny model with random weights is loaded, so the audio is noise, "
                f"{DEMO_MAX_NEW_TOKENS} frames at most by default. "
                "Start without `--demo` to load the real checkpoint.",
                elem_id="demo-notice",
            )

        with gr.Tabs():
            with gr.Tab("Speak", id="speak"):
                text = gr.Textbox(label="Text", lines=6, placeholder="Type what to say…", elem_id="speak-text")
                with gr.Row():
                    voice = voice_dropdown("Voice", "speak-voice")
                    generate = gr.Button("Generate", variant="primary", elem_id="generate", scale=0)
                if settings.stream_ui_audio:
                    audio = gr.Audio(
                        label="Speech", streaming=True, autoplay=True, interactive=False, elem_id="speak-audio"
                    )
                else:
                    audio = gr.Audio(label="Speech", interactive=False, elem_id="speak-audio")
                    gr.Markdown("ffmpeg was not found, so audio plays when it is complete instead of streaming.")
                with gr.Row():
                    download = gr.File(label="Download", interactive=False, elem_id="speak-download")
                    stats = gr.Markdown(label="Stats", elem_id="speak-stats")
                examples = _examples()
                if examples:
                    gr.Examples(examples, inputs=[text], label="Examples")

            with gr.Tab("Voice clone", id="clone"):
                with gr.Row():
                    with gr.Column():
                        ref_audio = gr.Audio(
                            sources=["upload", "microphone"], type="filepath", label="Reference clip (5-30 s)",
                            elem_id="ref-audio",
                        )
                        ref_text = gr.Textbox(label="Transcript of the clip", lines=2, elem_id="ref-text")
                        preview_text = gr.Textbox(
                            label="Preview text", value="Hello! This is how the cloned voice sounds.", lines=2
                        )
                        preview_btn = gr.Button("Preview")
                        preview_audio = gr.Audio(label="Preview", interactive=False)
                        with gr.Row():
                            new_name = gr.Textbox(label="Save as", placeholder="voice name", elem_id="voice-name")
                            save_btn = gr.Button("Save voice", variant="primary", scale=0)
                    with gr.Column():
                        saved = gr.Dataframe(
                            h.saved_voices_table(), headers=["voice", "transcript"], label="Saved voices",
                            interactive=False, elem_id="saved-voices",
                        )
                        picked = gr.Dropdown(
                            sorted(synth.engine.voices.list()), value=None, label="Saved voice", allow_custom_value=True
                        )
                        picked_audio = gr.Audio(label="Its reference clip", interactive=False)
                        with gr.Row():
                            rename_to = gr.Textbox(label="Rename to")
                            rename_btn = gr.Button("Rename", scale=0)
                            delete_btn = gr.Button("Delete", variant="stop", scale=0)
                        voice_status = gr.Markdown(label="Status")

            with gr.Tab("Batch", id="batch"):
                with gr.Row():
                    lines = gr.Textbox(label="One text per line", lines=8, elem_id="batch-lines")
                    upload = gr.File(label="…or a .txt / .csv file", file_types=[".txt", ".csv"], type="filepath")
                with gr.Row():
                    batch_voice = voice_dropdown("Voice", "batch-voice")
                    batch_btn = gr.Button("Generate all", variant="primary", scale=0, elem_id="batch-run")
                table = gr.Dataframe(
                    headers=BATCH_HEADERS, label="Results (click a row to play it)", interactive=False,
                    elem_id="batch-table",
                )
                item_audio = gr.Audio(label="Selected item", interactive=False)
                archive = gr.File(label="All files (zip)", interactive=False)
                item_paths = gr.State([])

            with gr.Tab("Advanced settings", id="settings"):
                gr.Markdown("Used by Speak, Preview and Batch.")
                sampling = _sampling_controls(DEMO_MAX_NEW_TOKENS if demo_mode else 0)

            with gr.Tab("System", id="system"):
                system = gr.Markdown(h.system_markdown(), label="System", elem_id="system-stats")
                refresh = gr.Button("Refresh")
                gr.Timer(5).tick(
                    h.system_markdown, outputs=system, queue=False, show_progress="hidden", api_visibility="private"
                )

        # ----- wiring -----
        gpu = {"concurrency_limit": settings.ui_concurrency, "concurrency_id": "engine"}
        generate.click(
            event(h.speak, "ui/speak"), [text, voice, ref_audio, ref_text, *sampling], [audio, download, stats],
            api_name="speak", **gpu,
        )
        preview_btn.click(
            event(h.preview, "ui/preview"), [ref_audio, ref_text, preview_text, *sampling], preview_audio,
            api_name="preview_voice", **gpu,
        )
        batch_btn.click(
            event(h.batch, "ui/batch"), [lines, upload, batch_voice, ref_audio, ref_text, *sampling],
            [table, archive, item_paths], api_name="batch", **gpu,
        )
        table.select(h.batch_item, item_paths, item_audio, api_visibility="private")

        def refresh_voices(uploaded_clip, current_speak, current_batch):
            """New choices everywhere a voice is picked, keeping selections that still exist."""
            choices = h.voice_choices(uploaded=bool(uploaded_clip))
            values = {value for _, value in choices}
            ids = sorted(synth.engine.voices.list())

            def keep(current):
                return current if current in values else NO_VOICE

            return (
                gr.Dropdown(choices=choices, value=keep(current_speak)),
                gr.Dropdown(choices=choices, value=keep(current_batch)),
                gr.Dropdown(choices=ids, value=None),
                h.saved_voices_table(),
            )

        voice_outputs = [voice, batch_voice, picked, saved]
        voice_inputs = [ref_audio, voice, batch_voice]
        for button, fn, inputs, name in (
            (save_btn, h.save_voice, [new_name, ref_audio, ref_text], "save_voice"),
            (rename_btn, h.rename_voice, [picked, rename_to], "rename_voice"),
            (delete_btn, h.delete_voice, [picked], "delete_voice"),
        ):
            button.click(event(fn, f"ui/{name}"), inputs, voice_status, api_name=name).success(
                refresh_voices, voice_inputs, voice_outputs, api_visibility="private"
            )
        ref_audio.change(
            lambda clip, s, b: refresh_voices(clip, UPLOADED if clip else s, b),
            voice_inputs, voice_outputs, api_visibility="private",
        )
        picked.change(h.voice_sample, picked, picked_audio, api_visibility="private")
        gr.api(h.saved_voices_table, api_name="list_voices")
        refresh.click(h.system_markdown, outputs=system, api_name="system")
        demo.load(refresh_voices, voice_inputs, voice_outputs, api_visibility="private")

    demo.queue(default_concurrency_limit=settings.ui_concurrency)
    return demo
