"""Read a request body (JSON, msgpack or multipart) into a pydantic model, or fail with a 4xx."""

from __future__ import annotations

import json
from typing import TypeVar

import ormsgpack
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request

from .errors import HTTPProblem

M = TypeVar("M", bound=BaseModel)

JSON = "application/json"
MSGPACK = "application/msgpack"
MULTIPART = "multipart/form-data"
FORM = "application/x-www-form-urlencoded"  # a form without files; read as multipart is
BODY_TYPES = (JSON, MSGPACK, MULTIPART)

# Multipart has no nesting: inline references come as repeated file parts and transcripts.
REFERENCE_AUDIO_PART = "reference_audio"
REFERENCE_TEXT_PART = "reference_text"


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def describe(errors) -> str:
    """`temperature: Input should be less than or equal to 1` rather than pydantic's dump."""
    parts = []
    for item in errors:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {item.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def validate(model: type[M], data) -> M:
    if not isinstance(data, dict):
        raise HTTPProblem(422, "the request body must be an object with named fields")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise HTTPProblem(422, describe(e.errors())) from None


async def read_body(request: Request, model: type[M]) -> M:
    kind = media_type(request)
    if kind == JSON:
        try:
            data = json.loads(await request.body() or b"null")
        except ValueError as e:
            raise HTTPProblem(400, f"the body is not valid JSON: {e}") from None
    elif kind == MSGPACK:
        try:
            data = ormsgpack.unpackb(await request.body())
        except (ormsgpack.MsgpackDecodeError, ValueError) as e:
            raise HTTPProblem(400, f"the body is not valid msgpack: {e}") from None
    elif kind in (MULTIPART, FORM):
        data = await _form_fields(request)
    else:
        shown = kind or "none"
        raise HTTPProblem(415, f"unsupported Content-Type {shown}; send one of {', '.join(BODY_TYPES)}")
    return validate(model, data)


async def read_upload(upload) -> bytes:
    if not isinstance(upload, UploadFile):
        raise HTTPProblem(422, "audio must be sent as a file part")
    return await upload.read()


async def _form_fields(request: Request) -> dict:
    try:
        form = await request.form()
    except Exception as e:  # malformed multipart: the parser's message is the useful part
        raise HTTPProblem(400, f"the multipart body could not be read: {e}") from None
    data = {
        k: await read_upload(v) if isinstance(v, UploadFile) else v
        for k, v in form.items()
        if k not in (REFERENCE_AUDIO_PART, REFERENCE_TEXT_PART)
    }
    audios = form.getlist(REFERENCE_AUDIO_PART)
    texts = form.getlist(REFERENCE_TEXT_PART)
    if len(audios) != len(texts):
        raise HTTPProblem(
            422,
            f"send one {REFERENCE_TEXT_PART} for each {REFERENCE_AUDIO_PART} "
            f"(got {len(audios)} audio parts and {len(texts)} transcripts)",
        )
    if audios:
        data["references"] = [
            {"audio": await read_upload(a), "text": t} for a, t in zip(audios, texts, strict=True)
        ]
    return data
