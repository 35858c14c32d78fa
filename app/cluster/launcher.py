"""launch.py's cluster mode: `--replicas N|auto|MIN-MAX` on a local Ray cluster, or on an existing
one with `--ray-address`. Ray Serve's HTTP proxy listens where the single server would."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from pathlib import Path

from loguru import logger

REPO_ROOT = Path(__file__).resolve().parents[2]  # a checkout, or site-packages for an installed copy
# What an existing cluster's nodes need of this checkout (Ray uploads it as the job's working dir).
UPLOAD_EXCLUDES = [".git", "tests", "docs", "checkpoints", "deploy", "*.wav", "*.pt", "__pycache__"]


def from_checkout(root: Path = REPO_ROOT) -> bool:
    """Whether this code runs from a checkout (else from an installed package, whose folder is all of
    site-packages: never uploaded or put on PYTHONPATH; the nodes import their own installed copy)."""
    return (root / "pyproject.toml").is_file()


def job_runtime_env(env: dict[str, str], root: Path = REPO_ROOT) -> dict:
    """The runtime_env of the job on an existing cluster: a checkout travels as its working dir."""
    runtime = {"env_vars": env}
    if from_checkout(root):
        runtime.update(working_dir=str(root), excludes=UPLOAD_EXCLUDES)
    return runtime


def parse_replicas(text: str) -> tuple[int | None, int | None]:
    """'N' -> (N, N); 'MIN-MAX' -> autoscaling bounds; 'auto' -> (None, None): one per GPU."""
    text = str(text).strip().lower()
    if text == "auto":
        return None, None
    low, sep, high = text.partition("-")
    if low.isdigit() and (not sep or high.isdigit()):
        low_n, high_n = int(low), int(high if sep else low)
        if high_n >= 1 and low_n <= high_n:
            return low_n, high_n
    raise ValueError(f"--replicas takes a count (2), a range to autoscale in (1-4) or auto, got {text!r}")


def cluster_settings(replicas: str, config, gpus_in_cluster: float, drain_s: float | None = None):
    """The Serve settings of --replicas; drain_s None keeps ClusterSettings' own."""
    from .application import ClusterSettings, replica_places

    low, high = parse_replicas(replicas)
    on_gpu = config.device != "cpu"
    if low is None:
        if not on_gpu or gpus_in_cluster < 1:
            raise ValueError("--replicas auto starts one replica per GPU, and this cluster has none; "
                             "give a count, e.g. --replicas 2 --device cpu")
        low = high = int(gpus_in_cluster)
    taken = {"gpus_per_replica": 1 if on_gpu else 0, "max_ongoing_requests": replica_places(config, on_gpu)}
    if drain_s is not None:
        taken["drain_s"] = drain_s
    if low == high:
        return ClusterSettings(replicas=low, **taken)
    return ClusterSettings(min_replicas=low, max_replicas=high, **taken)


def serve_cluster(config, plan, replicas: str, address: str | None) -> int:
    import ray
    from ray import serve

    from .application import APP_NAME, application

    if plan.share:
        logger.warning("--share publishes the Gradio UI, which the cluster does not serve: no share link")
    if plan.ui:
        logger.info("the cluster serves the REST API (the Gradio UI runs with the single server)")
    env = {"S1_MINI_API_KEY": plan.api_key} if plan.api_key else {}
    if address:
        ray.init(address=address, runtime_env=job_runtime_env(env))
    else:
        # The local cluster's workers inherit this environment: the checkout's path and the API key.
        if from_checkout():
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        os.environ.update(env)
        ray.init(include_dashboard=False)
    try:
        try:
            settings = cluster_settings(replicas, config, ray.cluster_resources().get("GPU", 0), plan.drain_s)
        except ValueError as e:
            logger.error("bad setting: {}", e)
            return 2
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        logger.info("Ray cluster at {}: {} node(s), {:g} GPU(s); engine replicas: {}", ray.get_runtime_context().gcs_address,
                    len(nodes), ray.cluster_resources().get("GPU", 0),
                    f"{settings.min_replicas}-{settings.max_replicas} (autoscaling)" if settings.autoscaling
                    else settings.replicas)
        serve.start(http_options={"host": plan.host, "port": plan.port})
        app = application(config, settings, root_path=plan.root_path, cors_origins=plan.cors_origins,
                          openai_voices=dict(plan.openai_voices))
        serve.run(app, name=APP_NAME, route_prefix="/")
        log_replicas(plan)
        wait_for_stop()
    finally:
        if address:
            serve.delete(APP_NAME)  # other applications on a shared cluster keep running
        else:
            serve.shutdown()
        ray.shutdown()
    return 0


def log_replicas(plan) -> None:
    """What /ready says: each replica, its host and device."""
    host = "127.0.0.1" if plan.host in ("0.0.0.0", "::") else plan.host
    request = urllib.request.Request(f"http://{host}:{plan.port}/ready")
    if plan.api_key:
        request.add_header("Authorization", f"Bearer {plan.api_key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            ready = json.load(answer)
    except OSError as e:
        logger.warning("could not read /ready: {}", e)
        return
    for replica in ready.get("replicas", []):
        logger.info("engine replica {} on {} ({}): {} sequence slots", replica["replica"], replica["host"],
                    replica["device"], replica["slots"])
    logger.info("{} replica(s), {} sequence slots; REST API at http://{}:{}/v1/ (docs at /docs)",
                ready.get("replicas_ready"), ready.get("slots"), host, plan.port)


def wait_for_stop() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    logger.info("stopping the engine replicas")
