"""Saved voices over REST: the reference server's /v1/references/* routes and answers.

The same VoiceStore backs the UI's voice tab, so a voice saved in one place shows in the other.
Answers are JSON, or msgpack when the client sends `Accept: application/msgpack`.
"""

from __future__ import annotations

import ormsgpack
from fastapi import APIRouter, File, Form, Request, UploadFile
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from .api_schema import DeleteReferenceRequest, RenameReferenceRequest
from .body import BODY_TYPES, MSGPACK, read_body, validate
from .errors import error_responses
from .openapi import request_body


def _answer(request: Request, body: dict) -> Response:
    if MSGPACK in request.headers.get("accept", ""):
        return Response(ormsgpack.packb(body), media_type=MSGPACK)
    return JSONResponse(body)


def build_router(voices) -> APIRouter:
    router = APIRouter(prefix="/v1/references", tags=["voices"])

    @router.post("/add", summary="Save a voice: a reference clip and its transcript",
                 responses=error_responses(400, 409, 413, 422))
    async def add(
        request: Request,
        id: str = Form(description="Voice id: letters, digits, space, - and _"),  # noqa: A002 (reference's field name)
        audio: UploadFile = File(description="Reference audio file"),
        text: str = Form(description="Transcript of the reference audio"),
    ):
        data = await audio.read()
        await run_in_threadpool(voices.add, id, data, text)
        return _answer(request, {"success": True, "message": f"voice {id!r} saved", "reference_id": id})

    @router.get("/list", summary="Saved voice ids, sorted")
    async def list_voices(request: Request):
        ids = voices.list()  # one directory listing: on the loop, never behind a busy thread pool
        return _answer(request, {"success": True, "reference_ids": sorted(ids), "message": "Success"})

    @router.delete(
        "/delete",
        summary="Delete a saved voice",
        openapi_extra=request_body(DeleteReferenceRequest, BODY_TYPES),
        responses=error_responses(400, 404, 413, 415, 422),
    )
    async def delete(request: Request):
        """The id comes in the body, or as the query parameter `reference_id`."""
        if "reference_id" in request.query_params:
            req = validate(DeleteReferenceRequest, dict(request.query_params))
        else:
            req = await read_body(request, DeleteReferenceRequest)
        await run_in_threadpool(voices.delete, req.reference_id)
        message = f"voice {req.reference_id!r} deleted"
        return _answer(request, {"success": True, "message": message, "reference_id": req.reference_id})

    @router.post(
        "/update",
        summary="Rename a saved voice",
        openapi_extra=request_body(RenameReferenceRequest, BODY_TYPES),
        responses=error_responses(400, 404, 409, 413, 415, 422),
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
