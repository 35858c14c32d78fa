"""The Serve application: engine replicas (one per GPU) behind the HTTP ingress, and its settings.

`application(config, settings)` is what launch.py runs; `build(args)` is the import path of Serve
config files (deploy/serve.yaml) and of `serve run app.cluster.application:build replicas=2`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from ray import serve
from ray.serve.config import BackpressureConfig, RequestRouterConfig

from engine.config import EngineConfig
from engine.device import AUTO_SLOTS, AUTO_SLOTS_ELSEWHERE
from engine.errors import InputError

from ..settings import parse_openai_voices, parse_origins
from .ingress import ENGINE_DEPLOYMENT, Ingress
from .remote_engine import CLUSTER_FULL_RETRY_S
from .replica import EngineReplica
from .routing import VoiceAffinityRouter

APP_NAME = "s1-mini"


@dataclass(frozen=True)
class ClusterSettings:
    """How many engine replicas, what each gets, and how Serve routes and scales them.

    A fixed `replicas` count, or autoscaling between `min_replicas` and `max_replicas` that keeps
    about `target_ongoing_requests` requests on each replica (Serve adds replicas above it, removes
    them below it after a while). `max_ongoing_requests` is what Serve sends one replica at most
    (past its slots they wait in its engine's queue): what its engine takes, see `replica_places`.
    Requests the replicas cannot take wait in the ingress for the first replica with room, up to
    `max_queued_requests` (default: `queue_limit`); past that the cluster answers 429 with Retry-After.
    When Serve stops a replica (shutdown, scaling down, a redeploy), the requests it holds get
    `drain_s` seconds to finish, as --drain-seconds gives one server's.
    """

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 32
    gpus_per_replica: float = 1
    cpus_per_replica: float = 1
    max_ongoing_requests: int = 128
    max_queued_requests: int | None = None
    ingress_replicas: int = 1
    ingress_cpus: float = 0  # it relays bytes: no CPU of its own is reserved for it
    health_check_period_s: float = 5
    routing_stats_period_s: float = 1
    drain_s: float = 10

    def __post_init__(self):
        if self.replicas < 1:
            raise InputError(f"replicas must be at least 1, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise InputError("autoscaling needs both min_replicas and max_replicas")
        if self.autoscaling and not 0 <= self.min_replicas <= self.max_replicas or (
                self.max_replicas is not None and self.max_replicas < 1):
            raise InputError(f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                             f"{self.min_replicas}-{self.max_replicas}")
        if self.target_ongoing_requests <= 0 or self.max_ongoing_requests < 1 or self.queue_limit < 1:
            raise InputError("target_ongoing_requests, max_ongoing_requests and max_queued_requests must be positive")
        if not 0 <= self.drain_s <= 3600:
            raise InputError(f"drain_s must be between 0 and 3600 seconds, got {self.drain_s}")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    @property
    def queue_limit(self) -> int:
        """Requests the ingress holds for the engine replicas. Serve counts a request as queued from its
        arrival until a replica has taken it, so a burst that the replicas have room for is all queued
        at once for a moment: below the cluster's places (every replica's max_ongoing_requests) such a
        burst would be refused while replicas sit idle. Hence by default the cluster's places, at its
        largest when autoscaling: a full cluster holds as many more, served as replicas free up."""
        if self.max_queued_requests is not None:
            return self.max_queued_requests
        return self.max_ongoing_requests * (self.max_replicas or self.replicas)

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
            "max_queued_requests": self.queue_limit,
            # Past the queue Serve refuses a request; the ingress answers that with the API's 429 and
            # this Retry-After (RemoteEngine), as one server does when its engine's queue is full.
            "backpressure_config": BackpressureConfig(status_code=429, retry_after_s=CLUSTER_FULL_RETRY_S),
            "health_check_period_s": self.health_check_period_s,
            "graceful_shutdown_timeout_s": self.drain_s,
            "request_router_config": RequestRouterConfig(
                request_router_class=VoiceAffinityRouter,
                request_routing_stats_period_s=self.routing_stats_period_s,
                request_routing_stats_timeout_s=max(self.routing_stats_period_s * 5, 5),
            ),
        }

    def ingress_options(self) -> dict:
        return {"name": "Ingress", "num_replicas": self.ingress_replicas,
                "ray_actor_options": {"num_cpus": self.ingress_cpus},
                # The ingress only relays: it holds every open stream of the cluster at once, and
                # relays them while the engine replicas drain.
                "max_ongoing_requests": 4096, "health_check_period_s": self.health_check_period_s,
                "graceful_shutdown_timeout_s": self.drain_s}

    @classmethod
    def from_args(cls, args: dict) -> "ClusterSettings":
        """From a Serve config's `args` (strings or numbers), ignoring the engine's own fields."""
        values = {}
        for f in fields(cls):
            if args.get(f.name) is not None:
                kind = float if "float" in str(f.type) else int
                values[f.name] = kind(args[f.name])
        return cls(**values)


def replica_places(config: EngineConfig, on_gpu: bool) -> int:
    """What one engine takes at once: its sequence slots and its queue. Serve sends a replica no more,
    so that a busy replica's overflow goes to another replica or waits in Serve's queue instead of
    getting the engine's 429 while other replicas have room."""
    slots = config.max_batch_size or AUTO_SLOTS.get("cuda" if on_gpu else "cpu", AUTO_SLOTS_ELSEWHERE)
    return slots + config.max_queue


def application(config: EngineConfig, settings: ClusterSettings, root_path: str = "", **web):
    """`web`: the ingress's other AppSettings (cors_origins, openai_voices), as launch.py plans them."""
    # Serve counts a replica's place free as soon as it cancels a call (the client left), while the
    # engine lets that request go at its next step. The engine's queue takes as many again as Serve
    # sends a replica, so that a request Serve sends meanwhile waits for its slot instead of getting
    # the engine's 429; Serve's max_ongoing_requests stays what bounds a replica's live requests.
    replica_config = replace(config, max_queue=config.max_queue + settings.max_ongoing_requests)
    engine = serve.deployment(EngineReplica).options(**settings.engine_options()).bind(replica_config)
    ingress = serve.deployment(Ingress).options(**settings.ingress_options())
    return ingress.bind(engine, root_path=root_path, voices_dir=config.voices_dir,
                        max_reference_seconds=config.max_reference_seconds, **web)


def build(args: dict):
    """Serve config entry point. Engine settings come from S1_MINI_* variables (the config's
    runtime_env) and from `args` named like EngineConfig's fields; the web ones (CORS origins,
    OpenAI voice names) from S1_MINI_CORS_ORIGINS and S1_MINI_OPENAI_VOICES, as on launch.py; the
    rest from ClusterSettings'."""
    args = dict(args or {})
    engine_fields = {f.name for f in fields(EngineConfig)}
    environ = dict(os.environ)
    environ.update({f"S1_MINI_{name.upper()}": str(value) for name, value in args.items() if name in engine_fields})
    config = EngineConfig.from_env(environ)
    settings = ClusterSettings.from_args(args)
    if args.get("max_ongoing_requests") is None:
        settings = replace(settings, max_ongoing_requests=replica_places(config, settings.gpus_per_replica > 0))
    try:
        openai_voices = parse_openai_voices(environ.get("S1_MINI_OPENAI_VOICES", ""))
    except ValueError as exc:
        raise InputError(f"S1_MINI_OPENAI_VOICES: {exc}") from None
    return application(config, settings, root_path=str(args.get("root_path") or ""),
                       cors_origins=parse_origins(environ.get("S1_MINI_CORS_ORIGINS", "")), openai_voices=openai_voices)
