"""AppSettings: what the web layer needs beyond the engine's own EngineConfig."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.audio import ffmpeg_available


@dataclass(frozen=True)
class AppSettings:
    # None = open; otherwise Bearer key for the API, password for the UI. Out of the repr, so that no
    # log line or traceback that shows the settings shows the key.
    api_key: str | None = field(default=None, repr=False)
    root_path: str = ""  # public URL or sub-path the app is served under (proxies, RunPod)
    max_batch_items: int = 100  # texts per /v1/tts/batch request or UI batch run
    ui_concurrency: int = 8  # UI generations in flight at once; the engine batches them
    max_body_mb: int = 64  # every request body: the API's, the UI's uploads (reference clips, batch files) and calls
    # Gradio's streaming audio output runs ffmpeg per stream; without it the UI plays whole clips.
    stream_ui_audio: bool = field(default_factory=ffmpeg_available)
    title: str = "S1-mini Studio"
    ui: bool = True  # False: the REST API alone, without Gradio (launch.py --no-ui)
    # Threads for streamed API responses started with the app (app/bridge.StreamThreads); launch.py
    # asks for as many as the engine takes requests at once. More start when needed.
    stream_threads: int = 0
    # Browser origins allowed to call the API from their pages (CORS); none by default, "*" for any.
    cors_origins: tuple[str, ...] = ()
    # OpenAI voice name -> saved voice id for /v1/audio/speech; unmapped names speak in the model's own voice.
    openai_voices: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank; leave it unset to disable auth")
        if min(self.max_batch_items, self.ui_concurrency, self.max_body_mb) < 1:
            raise ValueError("max_batch_items, ui_concurrency and max_body_mb must be at least 1")
        if self.stream_threads < 0:
            raise ValueError("stream_threads must not be negative")
        for origin in self.cors_origins:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                raise ValueError(f"CORS origin {origin!r} must be * or start with http:// or https://")
        if self.openai_voices:
            object.__setattr__(self, "openai_voices", {k.lower(): v for k, v in self.openai_voices.items()})


def parse_openai_voices(text: str) -> dict[str, str]:
    """'alloy=narrator,nova=my voice' -> {'alloy': 'narrator', 'nova': 'my voice'}."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, voice = item.partition("=")
        if not sep or not name.strip() or not voice.strip():
            raise ValueError(f"--openai-voices takes NAME=SAVED_VOICE pairs separated by commas, got {item!r}")
        mapping[name.strip().lower()] = voice.strip()
    return mapping


def parse_origins(text: str) -> tuple[str, ...]:
    """'https://a.example, https://b.example' -> both; '*' allows any origin."""
    return tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
