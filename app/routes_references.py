"""Saved voices over REST: the reference server's /v1/references/* routes and answers.

The same VoiceStore backs the UI's voice tab, so a voice saved in one place shows in the other.
Bodies are JSON, msgpack or multipart; answers are negotiated as fish-speech does (app.negotiation).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from .api_schema import AddReferenceRequest, DeleteReferenceRequest, RenameReferenceRequest
from .body import BODY_TYPES, media_type, read_body, validate
from .negotiation import documented
from .negotiation import negotiated as _answer
from .errors import HTTPProblem, error_responses
from .openapi import request_body


def build_router(voices) -> APIRouter:
    router = APIRouter(prefix="/v1/references", tags=["voices"])

    @router.post(
        "/add",
        summary="Save a voice: a reference clip and its transcript",
        openapi_extra=request_body(AddReferenceRequest, BODY_TYPES),
        responses={**documented(), **error_responses(400, 409, 413, 415, 422)},
    )
    async def add(request: Request):
        """Multipart (an `audio` file part), JSON (`audio` base64-encoded) or msgpack (`audio` bytes)."""
        req = await read_body(request, AddReferenceRequest)
        await run_in_threadpool(voices.add, req.id, req.audio, req.text)
        return _answer(request, {"success": True, "message": f"voice {req.id!r} saved", "reference_id": req.id})

    @router.get("/list", summary="Saved voice ids, sorted", responses=documented())
    async def list_voices(request: Request):
        ids = voices.list()  # one directory listing: on the loop, never behind a busy thread pool
        return _answer(request, {"success": True, "reference_ids": sorted(ids), "message": "Success"})

    @router.delete(
        "/delete",
        summary="Delete a saved voice",
        openapi_extra=request_body(DeleteReferenceRequest, BODY_TYPES),
        responses={**documented(), **error_responses(400, 404, 413, 415, 422)},
    )
    async def delete(request: Request):
        """The id comes in the body, or as the query parameter `reference_id`."""
        if "reference_id" in request.query_params:
            req = validate(DeleteReferenceRequest, dict(request.query_params))
        elif not media_type(request) and not await request.body():
            raise HTTPProblem(422, "reference_id is missing: name the voice to delete with ?reference_id=ID "
                                   "or in a JSON or msgpack body")
        else:
            req = await read_body(request, DeleteReferenceRequest)
        await run_in_threadpool(voices.delete, req.reference_id)
        message = f"voice {req.reference_id!r} deleted"
        return _answer(request, {"success": True, "message": message, "reference_id": req.reference_id})

    @router.post(
        "/update",
        summary="Rename a saved voice",
        openapi_extra=request_body(RenameReferenceRequest, BODY_TYPES),
        responses={**documented(), **error_responses(400, 404, 409, 413, 415, 422)},
    )
    async def rename(request: Request):
        req = await read_body(request, RenameReferenceRequest)
        await run_in_threadpool(voices.rename, req.old_reference_id, req.new_reference_id)
        return _answer(
            request,
            {
                "success": True,
                "message": f"voice {req.old_reference_id!r} renamed to {req.new_reference_id!r}",
                "old_reference_id": req.old_reference_id,
                "new_reference_id": req.new_reference_id,
            },
        )

    return router
