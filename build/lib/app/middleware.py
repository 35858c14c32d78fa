"""Plain ASGI middleware (streams pass through untouched): request counting and a body size cap."""

from __future__ import annotations

from starlette.responses import JSONResponse

from .errors import HTTPProblem, Problem, error_body
from .metrics import Metrics

API_PREFIX = "/v1/"
# Low-cardinality route labels: only our own routes are counted, not Gradio's polling.
_COUNTED_PREFIXES = (API_PREFIX, "/health", "/ready", "/metrics")


class RequestMetrics:
    """Counts our own routes by path template and status (plain ASGI: streams pass untouched)."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # stays so if the app raises before answering

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            path = getattr(scope.get("route"), "path", None)  # set by the router when it matched
            if path and path.startswith(_COUNTED_PREFIXES):
                kind = None if status < 400 else Problem(status, "").kind
                self.metrics.observe_request(path, status, kind)


class BodySizeLimit:
    """Refuses API bodies over `max_bytes` with a 413 before they fill the memory.

    A declared Content-Length is checked up front; a chunked body is counted as it arrives.
    UI uploads are limited by Gradio's own max_file_size.
    """

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        problem = Problem(413, f"the request body is over {self.max_bytes // 2**20} MB; send shorter audio")
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await JSONResponse(error_body(problem), status_code=413)(scope, receive, send)
            return
        received = 0

        async def counted_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPProblem(problem.status, problem.message)
            return message

        await self.app(scope, counted_receive, send)
