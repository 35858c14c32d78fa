"""Fish Audio cloud calls that have no counterpart here: a 501 naming the SDK call and what to use
instead, rather than a bare 404 that reads like a wrong base URL."""

from __future__ import annotations

from fastapi import APIRouter

from .errors import HTTPProblem

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_UNSUPPORTED = {
    "/model": "Fish Audio's voice models (the SDK's voices.* calls) are not offered by this server: save a voice "
    "with POST /v1/references/add and list voices with GET /v1/references/list",
    "/v1/asr": "speech recognition (the SDK's asr.* calls) is not offered by this server: it does text to speech only",
    "/wallet": "account calls (the SDK's account.* calls) are not offered by this server: it has no accounts or credits",
}


def build_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)
    for prefix, message in _UNSUPPORTED.items():
        def refuse(message=message):
            raise HTTPProblem(501, message)

        router.add_api_route(prefix, refuse, methods=_METHODS)
        router.add_api_route(prefix + "/{rest:path}", refuse, methods=_METHODS)
    return router
