"""Plain ASGI middleware (streams pass through untouched): request counting, a body size cap, and
the answers for API paths that no route takes."""

from __future__ import annotations

import re

from starlette.responses import JSONResponse
from starlette.routing import compile_path

from .errors import HTTPProblem, Problem, error_body, openai_style
from .route_table import api_routes
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
    """Refuses request bodies over `max_bytes` with a 413 before they fill the memory: every path's,
    the UI's too (Gradio parses a JSON body whole, before its login check answers 401).

    A declared Content-Length is checked up front; a chunked body is counted as it arrives.
    """

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
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


class CrossSiteWrites:
    """Refuses a browser's request from a page on another site that could change something (any
    method but GET, HEAD and OPTIONS), unless --cors-origins allows that page's origin.

    A page may send forms and multipart bodies to any address without a preflight, so without an
    API key anyone's page could save, rename or delete this server's voices (a server on 127.0.0.1
    too, through its visitor's browser). Browsers mark such requests `Sec-Fetch-Site: cross-site`;
    other clients send no such header and are not affected.
    """

    SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

    def __init__(self, app, allowed_origins: tuple[str, ...] = ()):
        self.app = app
        self.allowed_origins = frozenset(allowed_origins)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] not in self.SAFE_METHODS:
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode("latin-1")
            if headers.get(b"sec-fetch-site") == b"cross-site" and not (
                    "*" in self.allowed_origins or origin in self.allowed_origins):
                problem = Problem(403, f"a page on another site ({origin or 'no origin'}) may not send this request; "
                                  "the server's operator can allow its origin with --cors-origins")
                await JSONResponse(error_body(problem, openai_style(scope["path"])), status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class UnmatchedApiRoutes:
    """405 with `Allow` for a method that the app's own routes do not take on a path they serve, and
    404 for an unknown path under /v1/, both in the API's error shape.

    The UI is mounted at "/" and would answer both with its own 404 otherwise. `routes` is the app's
    live route list, so routes added later are covered too.
    """

    def __init__(self, app, routes: list):
        self.app = app
        self.routes = routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        allowed: set[str] = set()
        for route in api_routes(self.routes):
            if _path_pattern(route.path).match(path):
                if method in route.methods:
                    await self.app(scope, receive, send)
                    return
                allowed |= route.methods
        if allowed:
            methods = ", ".join(sorted(allowed))
            problem = Problem(405, f"{path} does not take {method}; use {methods}", {"Allow": methods})
        elif path.startswith(API_PREFIX):
            problem = Problem(404, f"no route {path}; the API's routes are listed at /docs")
        else:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(error_body(problem, openai_style(path)), status_code=problem.status,
                                headers=problem.headers)
        await response(scope, receive, send)


def _path_pattern(path: str) -> re.Pattern:
    return compile_path(path)[0]  # the re module caches the compiled patterns
