"""fish-speech's answer format: msgpack unless the client asks for JSON.

`?format=json|msgpack` decides; otherwise an Accept header naming application/json and not
application/msgpack gets JSON. Everything else, `Accept: */*` included, gets msgpack.
"""

from __future__ import annotations

import ormsgpack
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .body import JSON, MSGPACK

_QUERY_CHOICES = {"json": True, JSON: True, "msgpack": False, MSGPACK: False}


# For `responses=` of routes that answer this way: both media types, one schema.
def documented(schema: dict | None = None, description: str = "msgpack, or JSON when asked for") -> dict:
    content = {t: {"schema": schema} if schema else {} for t in (MSGPACK, JSON)}
    return {200: {"description": description, "content": content}}


def wants_json(request: Request) -> bool:
    choice = request.query_params.get("format", "").strip().lower()
    if choice in _QUERY_CHOICES:
        return _QUERY_CHOICES[choice]
    accept = request.headers.get("accept", "").lower()
    return JSON in accept and MSGPACK not in accept


def negotiated(request: Request, body: dict, status: int = 200) -> Response:
    if wants_json(request):
        return JSONResponse(body, status_code=status)
    return Response(ormsgpack.packb(body), status_code=status, media_type=MSGPACK)
