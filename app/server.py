"""create_app: the REST API and the Gradio UI on one FastAPI app.

API routes are added before Gradio is mounted at "/", because that mount answers every path
that nothing else matched.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, RedirectResponse

from engine.errors import S1Error

from . import (
    openapi,
    routes_live,
    routes_openai,
    routes_references,
    routes_sagemaker,
    routes_system,
    routes_tts,
    routes_unsupported,
    routes_vqgan,
)
from .auth import UI_LOGIN_MESSAGE, ApiKeyGuard
from .body import describe, invalid_json
from .bridge import STREAM_THREADS
from .errors import HTTPProblem, Problem, error_body, openai_style, problem_for
from .metrics import Metrics
from .middleware import BodySizeLimit, CrossSiteWrites, RequestMetrics, UnmatchedApiRoutes
from .settings import AppSettings
from .speech import SpeechService


def create_app(engine, settings: AppSettings | None = None, replicas=None) -> FastAPI:
    """`replicas`: in a Ray Serve cluster, the view of the engine replicas (app.cluster.status.ClusterView),
    which adds them to /ready and their per-replica metrics to /metrics; None for one server."""
    settings = settings or AppSettings()
    STREAM_THREADS.keep(settings.stream_threads)  # before requests come: starting threads then held them up
    metrics = Metrics()
    if replicas is not None:
        metrics.registry.register(replicas)
    synth = SpeechService(engine, metrics)
    guard = ApiKeyGuard(settings.api_key)
    api_root = settings.root_path if settings.root_path.startswith("/") else ""

    app = FastAPI(
        title=settings.title,
        summary="OpenAudio S1-mini text to speech: fish-speech and OpenAI compatible REST API.",
        docs_url=None,  # these three are served below, behind the API key
        redoc_url=None,
        openapi_url=None,
        root_path=api_root,
    )
    _add_error_handlers(app)
    app.add_middleware(UnmatchedApiRoutes, routes=app.router.routes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_mb * 2**20)
    app.add_middleware(CrossSiteWrites, allowed_origins=tuple(settings.cors_origins))
    if settings.cors_origins:
        # Outermost: preflights are answered before the routes, and error answers carry the headers too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Content-Disposition", "X-Sample-Rate", "X-Audio-Format", "Server-Timing", "Retry-After"],
            max_age=600,
        )
    _add_docs(app, guard)

    protected = [Depends(guard)]
    app.include_router(routes_system.build_router(engine, metrics, guard, replicas))
    app.include_router(routes_tts.build_router(synth, settings), dependencies=protected)
    app.include_router(routes_openai.build_router(synth, settings), dependencies=protected)
    app.include_router(routes_references.build_router(engine.voices), dependencies=protected)
    app.include_router(routes_vqgan.build_router(engine), dependencies=protected)
    app.include_router(routes_live.build_router(synth, guard))
    app.include_router(routes_sagemaker.build_router(synth), dependencies=protected)
    app.include_router(routes_unsupported.build_router(), dependencies=protected)
    openapi.install(app, guard)

    if not settings.ui:
        @app.get("/", include_in_schema=False)
        async def api_only_root():
            return RedirectResponse(app.root_path + "/docs")

        return app
    return _mount_ui(app, synth, settings, metrics, guard)


def _mount_ui(app: FastAPI, synth: SpeechService, settings: AppSettings, metrics: Metrics, guard: ApiKeyGuard) -> FastAPI:
    import gradio as gr  # here, so that an API-only server runs without Gradio installed

    from .ui import CSS_PATH, build_ui

    blocks = build_ui(synth, settings, metrics)
    app = gr.mount_gradio_app(
        app,
        blocks,
        path="/",
        auth=guard.ui_password_ok if settings.api_key else None,
        auth_message=UI_LOGIN_MESSAGE if settings.api_key else None,
        root_path=settings.root_path or None,
        show_error=True,
        css_paths=[CSS_PATH] if CSS_PATH.is_file() else None,
        footer_links=["api", "gradio", "settings"],
        max_file_size=f"{settings.max_body_mb}mb",
    )
    # Gradio refuses a request's file paths that no upload made (a client can name any server file)
    # only once its Blocks have launched, which mount_gradio_app never marks.
    blocks.has_launched = True
    guard.ui_login_check = _gradio_login_check(app)
    return app


def _add_error_handlers(app: FastAPI):
    def respond(request: Request, problem: Problem) -> JSONResponse:
        body = error_body(problem, openai_style(request.url.path))
        return JSONResponse(body, status_code=problem.status, headers=problem.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        # A body FastAPI parsed itself: not JSON at all is the same mistake, and answer, as on
        # the routes that read their own bodies (app.body).
        broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if broken is not None:
            return respond(request, problem_for(invalid_json((broken.get("ctx") or {}).get("error", "malformed"))))
        return respond(request, Problem(422, describe(errors)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return respond(request, Problem(exc.status_code, str(exc.detail), dict(exc.headers or {})))

    async def mapped(request: Request, exc: Exception):
        return respond(request, problem_for(exc))

    # Exception last: Starlette answers it from its outermost layer and logs the traceback.
    for exc_type in (HTTPProblem, S1Error, Exception):
        app.add_exception_handler(exc_type, mapped)


DOCS_ASSETS = "/docs-assets"


def _add_docs(app: FastAPI, guard: ApiKeyGuard):
    """/docs and /redoc with their scripts and styles served from the fastapi-offline package, not a
    CDN: the pages render with no internet (air-gapped servers, SageMaker VPCs)."""
    from importlib.resources import files

    from fastapi.staticfiles import StaticFiles

    docs_guard = [Depends(guard.docs)]
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")
    assets = app.root_path + DOCS_ASSETS

    @app.get("/openapi.json", include_in_schema=False, dependencies=docs_guard)
    async def openapi_json():
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=docs_guard)
    async def swagger():
        return get_swagger_ui_html(
            openapi_url=app.root_path + "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js", swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False, dependencies=docs_guard)
    async def redoc():
        return get_redoc_html(
            openapi_url=app.root_path + "/openapi.json", title=f"{app.title} API",
            redoc_js_url=f"{assets}/redoc.standalone.js", redoc_favicon_url=f"{assets}/favicon.png",
            with_google_fonts=False,
        )


def _gradio_login_check(app: FastAPI):
    """True when the request carries a cookie of a logged-in UI session."""
    gradio_app = next(r.app for r in app.routes if getattr(r, "path", None) == "" and hasattr(r, "app"))

    def check(request: Request) -> bool:
        cookie_id = getattr(gradio_app, "cookie_id", None)
        tokens = getattr(gradio_app, "tokens", {})
        token = request.cookies.get(f"access-token-{cookie_id}") or request.cookies.get(
            f"access-token-unsecure-{cookie_id}"
        )
        return token is not None and token in tokens

    return check
