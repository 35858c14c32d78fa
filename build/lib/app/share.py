"""--share: a temporary public gradio.live link to this server.

Gradio makes share links only from its own launch(); a mounted app asks for the tunnel itself,
once the server answers. Failure (no internet, blocked port) is logged and the app runs on.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time

from loguru import logger

_WAIT_S = 120


def _wait_until_listening(host: str, port: int) -> bool:
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.5)
    return False


def _open(host: str, port: int):
    from gradio import networking

    if not _wait_until_listening(host, port):
        logger.error("share link not created: the server did not start listening on {}:{}", host, port)
        return
    try:
        url = networking.setup_tunnel(host, port, secrets.token_urlsafe(32), None, None)
    except Exception as e:  # no internet, blocked outbound port, missing frpc binary, ...
        logger.error("share link not created ({}); the app still runs locally", e)
        return
    logger.info("public share link (temporary): {}", url.replace("http://", "https://", 1))


def start_share_link(host: str, port: int):
    threading.Thread(target=_open, args=(host, port), name="share-link", daemon=True).start()
