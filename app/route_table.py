"""The app's HTTP routes as one flat list, whichever way FastAPI keeps included routers."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi.routing import APIRoute

try:  # FastAPI keeps included routers nested and flattens them here
    from fastapi.routing import iter_route_contexts
except ImportError:  # older FastAPI copies included routes into the app's own list
    iter_route_contexts = None


def api_routes(routes: list) -> Iterator:
    """Each APIRoute (or FastAPI's view of one with its router's prefix and dependencies): it has
    `path`, `path_format`, `methods`, `dependencies` and `original_route.include_in_schema`."""
    if iter_route_contexts is None:
        for route in routes:
            if isinstance(route, APIRoute):
                route.original_route = route
                yield route
        return
    for context in iter_route_contexts(routes):
        if isinstance(context.original_route, APIRoute):
            yield context
