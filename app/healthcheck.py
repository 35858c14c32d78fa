"""The container's HEALTHCHECK: exit 0 when the server answers /health on the app's port or serve
mode's, 1 otherwise. `python -m app.healthcheck` (standard library only: it runs every 30 s)."""

from __future__ import annotations

import os
import sys
import urllib.request


def ports(environ, server_args: list[str] | None = None) -> list[str]:
    """The ports to ask, most likely first: --listen's among the server's arguments, the variables
    that set the port, then the defaults of the app and of serve mode."""
    listens = [_listen_flag(server_args or []).rpartition(":")[2], environ.get("S1_MINI_LISTEN", "").rpartition(":")[2]]
    candidates = [*listens, environ.get("GRADIO_SERVER_PORT"), environ.get("SAGEMAKER_BIND_TO_PORT"), "7860", "8080"]
    return list(dict.fromkeys(p for p in candidates if p and p.isdigit()))


def _listen_flag(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg.startswith("--listen="):
            return arg.partition("=")[2]
        if arg == "--listen" and i + 1 < len(args):
            return args[i + 1]
    return ""


def container_server_args() -> list[str]:
    """The arguments of the container's PID 1, the server (the image's exec-form entrypoint)."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:  # not Linux, or not allowed to read it
        return []


def healthy(port: str, timeout_s: float = 4.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> int:
    return 0 if any(healthy(port) for port in ports(os.environ, container_server_args())) else 1


if __name__ == "__main__":
    sys.exit(main())
