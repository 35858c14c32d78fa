"""The OpenAPI document: bodies of routes that read their own (JSON, msgpack, multipart), and the
errors every operation can answer.

FastAPI documents a body only when it parses it; these routes parse by Content-Type, so their
body schema is declared here and the pydantic models are added to the components. Each route
declares the errors it answers itself (errors.error_responses); 500, and 401 on the routes behind
the API key, are added to every operation here, so a new route has them without asking.
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from .errors import ERROR_MEANINGS, ErrorBody, OpenAIErrorBody, openai_style
from .route_table import api_routes

_REF = "#/components/schemas/{model}"
_documented: set[type[BaseModel]] = set()


def request_body(model: type[BaseModel], content_types) -> dict:
    """`openapi_extra` for a route whose body is `model` in any of `content_types`."""
    _documented.add(model)
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {t: {"schema": schema} for t in content_types}}}


def install(app: FastAPI, guard):
    """guard: the ApiKeyGuard whose dependency marks a route as behind the key."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        doc = build()
        components = doc.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        for model in (*_documented, ErrorBody, OpenAIErrorBody):
            schema = model.model_json_schema(ref_template=_REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        keyed = guard.api_key is not None
        if keyed:
            components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
        for route in api_routes(app.routes):
            if not route.original_route.include_in_schema:
                continue
            protected = keyed and any(d.dependency is guard for d in route.dependencies)
            for method in route.methods:
                operation = doc["paths"][route.path_format][method.lower()]
                errors = [500, 401] if protected else [500]
                _add_errors(operation, errors, openai_style(route.path_format))
                if keyed:
                    operation["security"] = [{"bearer": []}] if protected else []
        app.openapi_schema = doc
        return doc

    app.openapi = openapi


def _add_errors(operation: dict, statuses: list[int], openai: bool):
    schema = {"$ref": _REF.format(model=(OpenAIErrorBody if openai else ErrorBody).__name__)}
    responses = operation.setdefault("responses", {})
    for status in statuses:
        responses.setdefault(str(status), {
            "description": ERROR_MEANINGS[status],
            "content": {"application/json": {"schema": schema}},
        })
