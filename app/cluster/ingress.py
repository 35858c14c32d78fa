"""Ingress: the HTTP deployment. It serves create_app's routes (the REST API of one server) over
RemoteEngine, reads and writes the shared voice store itself, and reaches the engine replicas
through a DeploymentHandle whose router is the VoiceAffinityRouter."""

from __future__ import annotations

import os

from ray import serve

from engine.references import default_voices_dir
from engine.voice_store import VoiceStore

from ..server import create_app
from ..settings import AppSettings
from .remote_engine import RemoteEngine
from .status import ClusterView

ENGINE_DEPLOYMENT = "EngineReplica"


@serve.ingress()
class Ingress:
    def __init__(self, engine, root_path: str = "", voices_dir: str | None = None,
                 max_reference_seconds: float | None = None, cors_origins: tuple[str, ...] = (),
                 openai_voices: dict[str, str] | None = None):
        self._engine = engine
        self._root_path = root_path
        self._web = {"cors_origins": tuple(cors_origins), "openai_voices": dict(openai_voices or {})}
        self._voices = VoiceStore(default_voices_dir(voices_dir), max_seconds=max_reference_seconds)

    async def __serve_build_asgi_app__(self):
        info = await self._engine.info.remote()  # also starts this handle's router
        view = ClusterView(ENGINE_DEPLOYMENT)
        engine = RemoteEngine(self._engine, info["sample_rate"], self._voices, view)
        # The key comes from this process's environment, never from deployment arguments, which
        # Ray keeps and shows in its state API and dashboard.
        settings = AppSettings(api_key=os.environ.get("S1_MINI_API_KEY") or None, root_path=self._root_path,
                               ui=False, stream_threads=info["capacity"], **self._web)
        return create_app(engine, settings, replicas=view)
