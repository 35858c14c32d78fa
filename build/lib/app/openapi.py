"""OpenAPI for routes that read their own bodies (JSON, msgpack, multipart).

FastAPI documents a body only when it parses it; these routes parse by Content-Type, so their
body schema is declared here and the pydantic models are added to the components.
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"
_documented: set[type[BaseModel]] = set()


def request_body(model: type[BaseModel], content_types) -> dict:
    """`openapi_extra` for a route whose body is `model` in any of `content_types`."""
    _documented.add(model)
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {t: {"schema": schema} for t in content_types}}}


def install(app: FastAPI, bearer_auth: bool):
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        doc = build()
        components = doc.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        for model in _documented:
            schema = model.model_json_schema(ref_template=_REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        if bearer_auth:
            components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
            doc["security"] = [{"bearer": []}]
        return doc

    app.openapi = openapi
