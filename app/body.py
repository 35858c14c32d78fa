"""Read a request body (JSON, msgpack or multipart) into a pydantic model, or fail with a 4xx."""

from __future__ import annotations

import json
import sys
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


# A body with thousands of bad values would otherwise get an answer megabytes long.
SHOWN_ERRORS = 10


def describe(errors) -> str:
    """`temperature: Input should be less than or equal to 1` rather than pydantic's dump; the first
    SHOWN_ERRORS of them, and how many more there are."""
    errors = list(errors)
    parts = []
    for item in errors[:SHOWN_ERRORS]:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {item.get('msg', 'invalid')}")
    if len(errors) > SHOWN_ERRORS:
        parts.append(f"and {len(errors) - SHOWN_ERRORS} more errors")
    return "; ".join(parts) or "invalid request"


def validate(model: type[M], data, strict: bool = False) -> M:
    """strict: types as declared (JSON and msgpack carry them: `"normalize": 0` is no boolean);
    form fields and query parameters are text, so they are converted."""
    if not isinstance(data, dict):
        raise HTTPProblem(422, "the request body must be an object with named fields")
    try:
        return model.model_validate(data, strict=strict)
    except ValidationError as e:
        raise HTTPProblem(422, describe(e.errors())) from None
    except RecursionError:  # a deeply nested value where a flat one belongs
        raise HTTPProblem(422, "the request body is nested too deeply for its fields") from None


def invalid_json(reason: str) -> HTTPProblem:
    """The one answer to a body that is not JSON, whichever route parsed it."""
    return HTTPProblem(400, f"the body is not valid JSON: {reason}")


def parse_json(raw: bytes):
    try:
        return json.loads(raw or b"null")
    except ValueError as e:
        if "integer string conversion" in str(e):  # Python's own limit, worded for programmers
            raise invalid_json(f"a number in it has more than {sys.get_int_max_str_digits()} digits") from None
        raise invalid_json(str(e)) from None
    except RecursionError:  # the parser recurses per level: thousands of [ or { exhaust the stack
        raise invalid_json("it is nested too deeply") from None


async def read_body(request: Request, model: type[M], body_types: tuple[str, ...] = BODY_TYPES,
                    max_bytes: int | None = None) -> M:
    """The body as `model`. max_bytes: a JSON or msgpack body's limit, below the server's, for a
    route whose parsed body takes many times its bytes (a list of 10 million ints: ~1 GB)."""
    kind = media_type(request)
    if kind not in body_types and not (kind == FORM and MULTIPART in body_types):
        shown = kind or "none"
        accepted = [*body_types, FORM] if MULTIPART in body_types else list(body_types)
        raise HTTPProblem(415, f"unsupported Content-Type {shown}; send one of {', '.join(accepted)}")
    if kind in (JSON, MSGPACK):
        body = await request.body()
        if max_bytes is not None and len(body) > max_bytes:
            raise HTTPProblem(413, f"the body is {len(body) / 2**20:.1f} MB; {request.url.path} takes at most "
                              f"{max_bytes / 2**20:g} MB")
    if kind == JSON:
        data = parse_json(body)
    elif kind == MSGPACK:
        try:
            data = ormsgpack.unpackb(body)
        except (ormsgpack.MsgpackDecodeError, ValueError) as e:
            raise HTTPProblem(400, f"the body is not valid msgpack: {e}") from None
    else:
        data = await _form_fields(request)
    return validate(model, data, strict=kind not in (MULTIPART, FORM))  # form fields are text


async def read_upload(upload) -> bytes:
    if not isinstance(upload, UploadFile):
        raise HTTPProblem(422, "audio must be sent as a file part")
    return await upload.read()


async def _form_fields(request: Request) -> dict:
    try:
        form = await request.form()
    except Exception as e:  # a malformed form: the parser's message is the useful part
        reason = getattr(e, "detail", None) or e  # Starlette's HTTPException prints its status first
        raise HTTPProblem(400, f"the form body could not be read: {reason}") from None
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
