"""The Serve application: engine replicas (one per GPU) behind the HTTP ingress, and its settings.

`application(config, settings)` is what launch.py runs; `build(args)` is the import path of Serve
config files (deploy/serve.yaml) and of `serve run app.cluster.application:build replicas=2`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from ray import serve
from ray.serve.config import RequestRouterConfig

from engine.config import EngineConfig
from engine.errors import InputError

from .ingress import ENGINE_DEPLOYMENT, Ingress
from .replica import EngineReplica
from .routing import VoiceAffinityRouter

APP_NAME = "s1-mini"


@dataclass(frozen=True)
class ClusterSettings:
    """How many engine replicas, what each gets, and how Serve routes and scales them.

    A fixed `replicas` count, or autoscaling between `min_replicas` and `max_replicas` that keeps
    about `target_ongoing_requests` requests on each replica (Serve adds replicas above it, removes
    them below it after a while). `max_ongoing_requests` is what Serve sends one replica at most
    (past its slots they wait in its engine's queue, past that queue the engine answers 429);
    requests waiting in the ingress for any replica beyond `max_queued_requests` get 429 there.
    """

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 32
    gpus_per_replica: float = 1
    cpus_per_replica: float = 1
    max_ongoing_requests: int = 128
    max_queued_requests: int = 64
    ingress_replicas: int = 1
    ingress_cpus: float = 0  # it relays bytes: no CPU of its own is reserved for it
    health_check_period_s: float = 5
    routing_stats_period_s: float = 1

    def __post_init__(self):
        if self.replicas < 1:
            raise InputError(f"replicas must be at least 1, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise InputError("autoscaling needs both min_replicas and max_replicas")
        if self.autoscaling and not 0 <= self.min_replicas <= self.max_replicas or (
                self.max_replicas is not None and self.max_replicas < 1):
            raise InputError(f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                             f"{self.min_replicas}-{self.max_replicas}")
        if self.target_ongoing_requests <= 0 or self.max_ongoing_requests < 1 or self.max_queued_requests < 1:
            raise InputError("target_ongoing_requests, max_ongoing_requests and max_queued_requests must be positive")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    def engine_options(self) -> dict:
        scale = ({"autoscaling_config": {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                         "initial_replicas": max(self.min_replicas, 1),
                                         "target_ongoing_requests": self.target_ongoing_requests}}
                 if self.autoscaling else {"num_replicas": self.replicas})
        return {
            "name": ENGINE_DEPLOYMENT,
            **scale,
            "ray_actor_options": {"num_gpus": self.gpus_per_replica, "num_cpus": self.cpus_per_replica},
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
            "health_check_period_s": self.health_check_period_s,
            # Loading and warming a full-size model (with compilation) can take minutes.
            "graceful_shutdown_timeout_s": 10,
            "request_router_config": RequestRouterConfig(
                request_router_class=VoiceAffinityRouter,
                request_routing_stats_period_s=self.routing_stats_period_s,
                request_routing_stats_timeout_s=max(self.routing_stats_period_s * 5, 5),
            ),
        }

    def ingress_options(self) -> dict:
        return {"name": "Ingress", "num_replicas": self.ingress_replicas,
                "ray_actor_options": {"num_cpus": self.ingress_cpus},
                # The ingress only relays: it holds every open stream of the cluster at once.
                "max_ongoing_requests": 4096, "health_check_period_s": self.health_check_period_s}

    @classmethod
    def from_args(cls, args: dict) -> "ClusterSettings":
        """From a Serve config's `args` (strings or numbers), ignoring the engine's own fields."""
        values = {}
        for f in fields(cls):
            if args.get(f.name) is not None:
                kind = float if "float" in str(f.type) else int
                values[f.name] = kind(args[f.name])
        return cls(**values)


def application(config: EngineConfig, settings: ClusterSettings, root_path: str = "", **web):
    """`web`: the ingress's other AppSettings (cors_origins, openai_voices), as launch.py plans them."""
    engine = serve.deployment(EngineReplica).options(**settings.engine_options()).bind(config)
    ingress = serve.deployment(Ingress).options(**settings.ingress_options())
    return ingress.bind(engine, root_path=root_path, voices_dir=config.voices_dir,
                        max_reference_seconds=config.max_reference_seconds, **web)


def build(args: dict):
    """Serve config entry point. Engine settings come from S1_MINI_* variables (the config's
    runtime_env) and from `args` named like EngineConfig's fields; the rest from ClusterSettings'."""
    args = dict(args or {})
    engine_fields = {f.name for f in fields(EngineConfig)}
    environ = dict(os.environ)
    environ.update({f"S1_MINI_{name.upper()}": str(value) for name, value in args.items() if name in engine_fields})
    config = EngineConfig.from_env(environ)
    return application(config, ClusterSettings.from_args(args), root_path=str(args.get("root_path") or ""))
