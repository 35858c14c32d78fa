"""API-key checks: a Bearer header for the REST API, a login form for the UI."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from .errors import HTTPProblem

UI_LOGIN_MESSAGE = "This server needs its API key: enter it as the password (any user name)."


def _same(given: str, key: str) -> bool:
    return hmac.compare_digest(given.encode(), key.encode())


def bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class ApiKeyGuard:
    """FastAPI dependency: passes when no key is configured or the request carries it.

    Async, so FastAPI runs it on the event loop: a sync dependency would wait for a thread of
    Starlette's shared pool, and a route behind the key would answer only as fast as that pool.
    """

    def __init__(self, api_key: str | None, ui_login_check=None):
        self.api_key = api_key
        # Browsers cannot add a header to /docs; a UI login (cookie) is accepted there instead.
        self.ui_login_check = ui_login_check

    def ui_password_ok(self, _username: str, password: str) -> bool:
        return self.api_key is None or _same(password, self.api_key)

    def __repr__(self) -> str:
        return f"ApiKeyGuard(api_key={'set' if self.api_key else None})"

    async def __call__(self, request: Request) -> None:
        if self.api_key is None:
            return
        token = bearer_token(request)
        if token is not None and _same(token, self.api_key):
            return
        raise HTTPProblem(
            401,
            "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
            {"WWW-Authenticate": "Bearer"},
        )

    async def docs(self, request: Request) -> None:
        """For the docs pages: the Bearer header or a logged-in UI session."""
        if self.ui_login_check is not None and self.ui_login_check(request):
            return
        await self(request)
