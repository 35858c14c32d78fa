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
    max_body_mb: int = 64  # API request bodies and UI uploads (reference clips, batch files)
    # Gradio's streaming audio output runs ffmpeg per stream; without it the UI plays whole clips.
    stream_ui_audio: bool = field(default_factory=ffmpeg_available)
    title: str = "S1-mini Studio"
    ui: bool = True  # False: the REST API alone, without Gradio (launch.py --no-ui)
    # Threads for streamed API responses started with the app (app/bridge.StreamThreads); launch.py
    # asks for as many as the engine takes requests at once. More start when needed.
    stream_threads: int = 0

    def __post_init__(self):
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank; leave it unset to disable auth")
        if min(self.max_batch_items, self.ui_concurrency, self.max_body_mb) < 1:
            raise ValueError("max_batch_items, ui_concurrency and max_body_mb must be at least 1")
        if self.stream_threads < 0:
            raise ValueError("stream_threads must not be negative")
