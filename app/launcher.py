"""Start S1-mini Studio: the Gradio UI and the REST API on one server.

Run as `s1-mini-studio` (the installed command) or `python launch.py` (a checkout, Spaces, Windows):

    python launch.py                      # real checkpoint, http://127.0.0.1:7860
    python launch.py --demo               # tiny random model: no download, no network
    python launch.py --random-weights     # full-size random weights: measure a GPU without the checkpoint
    python launch.py --no-ui              # the REST API alone
    python launch.py --no-compile         # Windows, or to skip compilation
    s1-mini-studio serve                  # Amazon SageMaker's container contract: the API on 0.0.0.0:8080

Every flag can also be set with an environment variable (shown in --help); a flag wins.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

# Before Gradio is imported: no analytics calls, so the app starts with no network at all.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
RUNPOD_WORKSPACE = "/workspace"
# SageMaker's inference container contract: started as `serve`, it listens on 8080 (or the port
# SAGEMAKER_BIND_TO_PORT names) and finds the model artifacts extracted under /opt/ml/model.
SAGEMAKER_PORT = 8080
SAGEMAKER_MODEL_DIR = "/opt/ml/model"
# SIGTERM: stop taking connections, let requests in flight finish this long, then stop. Interactive
# runs keep it short (open UI event streams would hold Ctrl+C up); `serve` fits it inside
# SageMaker's 30 s between SIGTERM and SIGKILL.
DRAIN_S = 3
SERVE_DRAIN_S = 25
KEEP_ALIVE_S = 75  # idle HTTP connections: longer than the usual client and proxy pools keep theirs


def build_parser() -> argparse.ArgumentParser:
    from engine.config import PRECISIONS, QUANTIZE_MODES

    p = argparse.ArgumentParser(
        description="S1-mini Studio: OpenAudio S1-mini text to speech, web UI and REST API on one server.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Other engine settings come from S1_MINI_<FIELD> environment variables, e.g.\n"
            "S1_MINI_CACHE_DIR (compiled kernels, reference codes), S1_MINI_VOICES_DIR (saved voices),\n"
            "S1_MINI_MAX_QUEUE, S1_MINI_MAX_REFERENCE_SECONDS, S1_MINI_SEED. HF_TOKEN / HF_HOME /\n"
            "HF_HUB_OFFLINE are read by the Hugging Face download.\n\n"
            "On RunPod (RUNPOD_POD_ID set) the server listens on 0.0.0.0, the public root is the pod's\n"
            "proxy URL, and caches and voices go under /workspace unless set otherwise."
        ),
    )
    p.add_argument(
        "mode", nargs="?", choices=["serve"],
        help=f"serve: Amazon SageMaker's container contract: the REST API alone on 0.0.0.0:{SAGEMAKER_PORT} "
        f"(SAGEMAKER_BIND_TO_PORT), the model from {SAGEMAKER_MODEL_DIR} when it holds one, {SERVE_DRAIN_S} s drain",
    )
    model = p.add_argument_group("model")
    model.add_argument(
        "--checkpoint", metavar="PATH_OR_REPO",
        help="checkpoint directory or Hugging Face repo id [S1_MINI_CHECKPOINT; default: "
        "./checkpoints/openaudio-s1-mini if present, else fishaudio/openaudio-s1-mini]",
    )
    model.add_argument(
        "--demo", action="store_true", default=None,
        help="tiny random-weight model: starts in seconds anywhere, makes noise, needs no download [S1_MINI_DEMO]",
    )
    model.add_argument(
        "--random-weights", action="store_true", default=None,
        help="the full-size S1-mini architecture with random weights: measures speed and memory without the "
        "checkpoint, makes noise [S1_MINI_RANDOM_WEIGHTS]",
    )
    model.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps [S1_MINI_DEVICE; default auto: the GPU if any]")
    model.add_argument(
        "--precision", choices=PRECISIONS,
        help="weights and activations [S1_MINI_PRECISION; default auto: bf16 on GPUs that have it, else fp16; fp16 on "
        "Apple MPS; fp32 on CPU]",
    )
    model.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=None,
        help="torch.compile with CUDA graphs; --no-compile runs the model's PyTorch ops uncompiled (on CUDA still "
        "inside CUDA graphs) [S1_MINI_COMPILE=on|off|auto; default auto: on where Triton and CUDA are present, off "
        "on Windows without Triton, CPU and MPS]",
    )
    model.add_argument(
        "--quantize", choices=QUANTIZE_MODES,
        help="quantize the transformer blocks with torchao: int8 (any device), int4 (NVIDIA compute capability "
        "8.0+), fp8 (8.9+); a checkpoint from scripts/quantize.py needs its own mode [S1_MINI_QUANTIZE; default none]",
    )
    model.add_argument(
        "--max-batch-size", type=int, help="sequences decoded at once by continuous batching (KV slots); 0 = auto: 64 "
        "on CUDA, 4 elsewhere; on CUDA any value is capped by free memory [S1_MINI_MAX_BATCH_SIZE; default 0]"
    )
    model.add_argument(
        "--max-text-length", type=int,
        help="characters per request, 0 = no limit [S1_MINI_MAX_TEXT_LENGTH; default 2000]",
    )
    server = p.add_argument_group("server")
    server.add_argument(
        "--listen", metavar="HOST:PORT",
        help=f"address to serve on [S1_MINI_LISTEN, else GRADIO_SERVER_NAME / GRADIO_SERVER_PORT; "
        f"default {DEFAULT_HOST}:{DEFAULT_PORT}; use 0.0.0.0 to accept other machines; :PORT keeps the default host]",
    )
    server.add_argument(
        "--root-path", metavar="URL_OR_PATH",
        help="public URL or sub-path when behind a proxy [S1_MINI_ROOT_PATH, else GRADIO_ROOT_PATH; "
        "on RunPod: https://<pod>-<port>.proxy.runpod.net]",
    )
    server.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on every route but /health; the UI asks for it as a password "
        "[S1_MINI_API_KEY]",
    )
    server.add_argument(
        "--cors-origins", metavar="ORIGINS",
        help="browser origins allowed to call the API from their pages, comma-separated (e.g. "
        "https://app.example.com), or * for any [S1_MINI_CORS_ORIGINS; default none]",
    )
    server.add_argument(
        "--openai-voices", metavar="NAME=VOICE,...",
        help="OpenAI voice names spoken by saved voices on /v1/audio/speech, e.g. alloy=narrator,nova=anna; "
        "unmapped names use the model's own voice [S1_MINI_OPENAI_VOICES]",
    )
    server.add_argument(
        "--share", action="store_true", default=None,
        help="also publish a temporary public gradio.live link (needs internet; not on Spaces) [S1_MINI_SHARE]",
    )
    server.add_argument(
        "--drain-seconds", type=float, metavar="S",
        help=f"on SIGTERM or Ctrl+C, let requests in flight finish for up to S seconds [S1_MINI_DRAIN_SECONDS; "
        f"default {DRAIN_S}, {SERVE_DRAIN_S} in serve mode]",
    )
    server.add_argument(
        "--no-ui", action="store_true", default=None,
        help="serve the REST API alone, without the Gradio UI (Gradio need not be installed) [S1_MINI_NO_UI]",
    )
    cluster = p.add_argument_group("several GPUs and machines (Ray Serve: pip install -r requirements-ray.txt)")
    cluster.add_argument(
        "--replicas", metavar="N|auto|MIN-MAX",
        help="serve the REST API from N engine replicas (one per GPU; auto: every GPU of the cluster; "
        "MIN-MAX: autoscale) through Ray Serve, routed by voice [S1_MINI_REPLICAS; default: one process, no Ray]",
    )
    cluster.add_argument(
        "--ray-address", metavar="ADDR",
        help="join this Ray cluster (ray start --head prints it, e.g. 10.0.0.1:6379) instead of starting one "
        "on this machine; needs --replicas [S1_MINI_RAY_ADDRESS]",
    )
    return p


@dataclass(frozen=True)
class ServerPlan:
    host: str
    port: int
    root_path: str
    api_key: str | None = field(repr=False)  # no log line or traceback shows it
    share: bool
    reasons: tuple[str, ...]
    ui: bool = True
    cors_origins: tuple[str, ...] = ()
    openai_voices: tuple[tuple[str, str], ...] = ()
    drain_s: float = DRAIN_S


def parse_listen(text: str, default_host: str = DEFAULT_HOST) -> tuple[str, int]:
    """'host:port', '[ipv6]:port' or ':port' (default_host: the host without --listen)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen must look like 127.0.0.1:7860 or [::1]:7860, got {text!r}")
    return host.strip("[]") or default_host, int(port)


def _flag_or_env(value, environ, *names):
    if value is not None:
        return value, "flag"
    for name in names:
        if environ.get(name):
            return environ[name], name
    return None, None


def _switch(flag: bool | None, environ, name: str) -> bool:
    """An on/off flag (None when not given), else its variable (1/true/yes/on or 0/false/no/off)."""
    from engine.config import parse_switch

    return bool(flag) if flag is not None else parse_switch(name, environ.get(name, ""))


def plan_server(args, environ) -> ServerPlan:
    reasons = []
    pod = environ.get("RUNPOD_POD_ID")
    serve_mode = getattr(args, "mode", None) == "serve"
    listen, source = _flag_or_env(args.listen, environ, "S1_MINI_LISTEN")
    # Behind RunPod's or a Space's proxy, 127.0.0.1 would be unreachable.
    proxied = pod or environ.get("SPACE_ID")
    default_host = environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if proxied else DEFAULT_HOST)
    if serve_mode and not listen:
        host, port = "0.0.0.0", int(environ.get("SAGEMAKER_BIND_TO_PORT") or SAGEMAKER_PORT)
        reasons.append(f"listening on {host}:{port} (serve mode: SageMaker's contract)")
    elif listen:
        host, port = parse_listen(listen, default_host)
        reasons.append(f"listening on {host}:{port} (from {source})")
    else:
        host = default_host
        port = int(environ.get("GRADIO_SERVER_PORT") or DEFAULT_PORT)
        if environ.get("GRADIO_SERVER_NAME") or environ.get("GRADIO_SERVER_PORT"):
            why = "from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT"
        elif proxied:
            why = "the platform's proxy reaches only 0.0.0.0"
        else:
            why = "default: this machine only"
        reasons.append(f"listening on {host}:{port} ({why})")

    root, source = _flag_or_env(args.root_path, environ, "S1_MINI_ROOT_PATH", "GRADIO_ROOT_PATH")
    if root:
        reasons.append(f"public root {root} (from {source})")
    elif pod:
        # A full https URL keeps Gradio from writing http:// links into an https page.
        root = f"https://{pod}-{port}.proxy.runpod.net"
        reasons.append(f"public root {root} (RunPod pod {pod}; expose HTTP port {port} on the pod)")

    api_key, _ = _flag_or_env(args.api_key, environ, "S1_MINI_API_KEY")
    share = _switch(args.share, environ, "S1_MINI_SHARE")
    if share and environ.get("SPACE_ID"):
        reasons.append("share link skipped: Hugging Face Spaces already serves the app publicly")
        share = False
    reasons.append(
        "API key required on every route but /health" if api_key else "no API key: open to anyone who can reach it"
    )
    ui = not (serve_mode or _switch(args.no_ui, environ, "S1_MINI_NO_UI"))
    if not ui:
        if share:
            raise ValueError("--share publishes the Gradio UI, which --no-ui turns off: drop one of them")
        reasons.append("REST API only (--no-ui): no Gradio UI")
    from app.settings import parse_openai_voices, parse_origins

    cors, _ = _flag_or_env(args.cors_origins, environ, "S1_MINI_CORS_ORIGINS")
    cors_origins = parse_origins(cors or "")
    if cors_origins:
        reasons.append(f"CORS: pages from {', '.join(cors_origins)} may call the API")
    voices, _ = _flag_or_env(args.openai_voices, environ, "S1_MINI_OPENAI_VOICES")
    openai_voices = tuple(parse_openai_voices(voices or "").items())
    drain, _ = _flag_or_env(args.drain_seconds, environ, "S1_MINI_DRAIN_SECONDS")
    try:
        drain_s = float(drain) if drain is not None else (SERVE_DRAIN_S if serve_mode else DRAIN_S)
    except ValueError:
        raise ValueError(f"--drain-seconds (S1_MINI_DRAIN_SECONDS) must be a number of seconds, got {drain!r}") from None
    if not 0 <= drain_s <= 3600:
        raise ValueError(f"--drain-seconds must be between 0 and 3600, got {drain}")
    return ServerPlan(host, port, root or "", api_key, share, tuple(reasons), ui, cors_origins, openai_voices,
                      drain_s)


def sagemaker_model_dir(args, environ, model_dir: str = SAGEMAKER_MODEL_DIR) -> str | None:
    """In serve mode, the checkpoint SageMaker extracted from the model's ModelDataUrl, unless one is
    named (flag or S1_MINI_CHECKPOINT) or the demo/random weights are asked for."""
    if getattr(args, "mode", None) != "serve" or args.checkpoint or environ.get("S1_MINI_CHECKPOINT"):
        return None
    if _switch(args.demo, environ, "S1_MINI_DEMO") or _switch(args.random_weights, environ, "S1_MINI_RANDOM_WEIGHTS"):
        return None
    path = Path(model_dir)
    return str(path) if path.is_dir() and any(path.iterdir()) else None


def runpod_storage_defaults(environ, workspace: str = RUNPOD_WORKSPACE) -> dict[str, str]:
    """On a RunPod pod, keep downloads, kernels and voices on the volume that survives restarts."""
    if not environ.get("RUNPOD_POD_ID") or not os.path.isdir(workspace):
        return {}
    base = workspace
    wanted = {
        "HF_HOME": f"{base}/huggingface",
        "S1_MINI_CACHE_DIR": f"{base}/s1-mini/cache",
        "S1_MINI_VOICES_DIR": f"{base}/s1-mini/voices",
    }
    return {k: v for k, v in wanted.items() if not environ.get(k)}


def engine_config(args, environ):
    from engine.config import EngineConfig

    compile_mode = None if args.compile is None else ("on" if args.compile else "off")
    return EngineConfig.from_env(
        environ,
        checkpoint=args.checkpoint or sagemaker_model_dir(args, environ),
        demo=args.demo,
        random_weights=args.random_weights,
        device=args.device,
        precision=args.precision,
        compile=compile_mode,
        quantize=args.quantize,
        max_batch_size=args.max_batch_size,
        max_text_length=args.max_text_length,
    )


def check_port_free(host: str, port: int):
    """Fail in a second, not after loading the model, when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        if os.name != "nt":  # as uvicorn does; on Windows SO_REUSEADDR would let a taken port pass
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise SystemExit(
                f"cannot listen on {host}:{port}: {e.strerror}. Pick another port, e.g. --listen {host}:{port + 1}"
            ) from None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    environ = os.environ
    from loguru import logger

    from app.logs import route_std_logging_to_loguru
    from engine.errors import S1Error

    route_std_logging_to_loguru()
    try:
        plan = plan_server(args, environ)
        for name, value in runpod_storage_defaults(environ).items():
            environ[name] = value
            logger.info("RunPod: {}={} (on the persistent volume)", name, value)
        config = engine_config(args, environ)
    except (ValueError, S1Error) as e:
        logger.error("bad setting: {}", e)
        return 2
    for reason in plan.reasons:
        logger.info(reason)
    check_port_free(plan.host, plan.port)
    replicas, _ = _flag_or_env(args.replicas, environ, "S1_MINI_REPLICAS")
    address, _ = _flag_or_env(args.ray_address, environ, "S1_MINI_RAY_ADDRESS")
    if address and not replicas:
        logger.error("bad setting: --ray-address serves through Ray Serve: give --replicas too (e.g. auto)")
        return 2
    if replicas:
        try:
            from app.cluster.launcher import serve_cluster
        except ImportError as e:
            logger.error("--replicas needs Ray Serve ({}): pip install -r requirements-ray.txt", e)
            return 2
        return serve_cluster(config, plan, replicas, address)
    return serve(config, plan)


def freeze_heap_once_captured(engine, poll_s: float = 1.0) -> threading.Thread:
    """Once the engine has captured every batch graph and has no request in flight, move the heap
    (modules, compiled code, graphs: millions of objects that live as long as the server) out of the
    garbage collector's reach. Its full passes scan them all while holding the GIL: pauses of a few
    hundred ms for every thread, the GPU worker's included, in the middle of a burst of streams.
    vLLM's engine does the same. Waiting for no request in flight keeps the
    last full pass (the collect before the freeze) out of a burst, and requests' objects out of the
    frozen heap. Objects made later are collected as usual."""
    import gc
    import time

    from loguru import logger

    def wait_then_freeze():
        while engine.capturing or engine.in_flight:
            time.sleep(poll_s)
        gc.collect()
        gc.freeze()
        logger.info("{} start-up objects moved out of the garbage collector's passes", gc.get_freeze_count())

    thread = threading.Thread(target=wait_then_freeze, name="s1-heap-freeze", daemon=True)
    thread.start()
    return thread


def serve(config, plan: ServerPlan) -> int:
    import time

    import uvicorn
    from loguru import logger

    from app.server import create_app
    from app.settings import AppSettings
    from app.share import start_share_link
    from engine.errors import S1Error
    from engine.facade import TTSEngine
    from engine.ffmpeg import ffmpeg
    from engine.references import default_cache_dir, default_voices_dir

    logger.info(
        "engine settings: checkpoint={} demo={} device={} precision={} compile={} quantize={} max_batch_size={} "
        "max_text_length={}", config.checkpoint or "default", config.demo, config.device, config.precision,
        config.compile, config.quantize, config.max_batch_size, config.max_text_length,
    )
    logger.info(
        "caches: engine {} | voices {} | Hugging Face {} | TorchInductor {}",
        default_cache_dir(config.cache_dir), default_voices_dir(config.voices_dir),
        os.environ.get("HF_HOME", "~/.cache/huggingface (default)"),
        os.environ.get("TORCHINDUCTOR_CACHE_DIR", "set by the engine's compile policy"),
    )
    ffmpeg()  # chosen and logged once, before Gradio or pydub look for it
    started = time.perf_counter()
    try:
        engine = TTSEngine.from_config(config)
        engine.warmup()
    except S1Error as e:
        logger.error("could not start the engine: {}", e)
        return 2
    freeze_heap_once_captured(engine)
    stats = engine.stats()
    logger.info(
        "model ready in {:.1f} s: {} on {} ({}), compile: {}", time.perf_counter() - started,
        stats.get("model"), stats.get("device"), stats.get("precision"), stats.get("compile"),
    )
    settings = AppSettings(api_key=plan.api_key, root_path=plan.root_path, ui_concurrency=engine.slots, ui=plan.ui,
                           stream_threads=engine.capacity, cors_origins=plan.cors_origins,
                           openai_voices=dict(plan.openai_voices))
    app = create_app(engine, settings)
    shown_host = "127.0.0.1" if plan.host in ("0.0.0.0", "::") else plan.host
    if plan.ui:
        logger.info("open http://{}:{}/ (API docs at /docs)", shown_host, plan.port)
    else:
        logger.info("REST API at http://{}:{}/v1/ (docs at /docs)", shown_host, plan.port)
    if plan.share:
        if not plan.api_key:
            logger.warning("--share without --api-key: anyone with the link can use this server")
        start_share_link(shown_host, plan.port)
    try:
        # No access log: the UI polls the queue several times a second; /metrics counts API requests.
        # On SIGTERM requests in flight get plan.drain_s to finish (DRAIN_S). Idle connections stay open
        # longer than clients and proxies keep them (httpx 5 s, uvicorn's default 5 s too): a client
        # that reuses one just as the server closes it gets "Server disconnected" (a load test sees a
        # few in its pauses between levels).
        uvicorn.run(app, host=plan.host, port=plan.port, log_config=None, access_log=False,
                    timeout_graceful_shutdown=plan.drain_s, timeout_keep_alive=KEEP_ALIVE_S)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
