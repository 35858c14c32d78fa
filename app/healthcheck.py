"""The container's HEALTHCHECK: exit 0 when the server answers /health on the app's port or serve
mode's, 1 otherwise. `python -m app.healthcheck` (standard library only: it runs every 30 s)."""

from __future__ import annotations

import os
import sys
import urllib.request


def ports(environ) -> list[str]:
    listen = environ.get("S1_MINI_LISTEN", "").rpartition(":")[2]
    candidates = [listen, environ.get("GRADIO_SERVER_PORT"), environ.get("SAGEMAKER_BIND_TO_PORT"), "7860", "8080"]
    return list(dict.fromkeys(p for p in candidates if p))


def healthy(port: str, timeout_s: float = 4.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> int:
    return 0 if any(healthy(port) for port in ports(os.environ)) else 1


if __name__ == "__main__":
    sys.exit(main())
