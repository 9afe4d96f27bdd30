"""Token auth for the few plain-HTTP control endpoints (kvmeta's Transfer Engine metadata):
the same tokens file, roles and :func:`~services.common.security.access.decide` as gRPC, keyed
by ``"METHOD /path"``. Refusals are 401 / 403 with an OpenAI-style error body."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from services.common.errors import StartupError
from services.common.security.access import Policy, decide
from services.common.security.interceptors import AUTH_HEADER, bearer_token
from services.common.security.settings import AuthSettings
from services.common.security.tokens import TokenFile

__all__ = ["auth_middleware", "http_auth"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS = {"UNAUTHENTICATED": (401, "invalid_api_key"), "PERMISSION_DENIED": (403, "forbidden")}


def auth_middleware(policy: Policy, tokens: TokenFile, *, open_reads: bool) -> Any:
    """An aiohttp middleware refusing requests ``policy`` does not allow for their token
    (``Authorization: Bearer TOKEN``); a route missing from ``policy`` is refused."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get(AUTH_HEADER)
        token = bearer_token([(AUTH_HEADER, header)]) if header else None
        entry = tokens.role_of(token) if token else None
        denied = decide(
            policy,
            f"{request.method} {request.path}",
            entry.role if entry is not None else None,
            token_given=bool(token),
            open_reads=open_reads,
            who=entry.name if entry is not None else "",
        )
        if denied is None:
            return await handler(request)
        status, code = _STATUS[denied.code.name]
        body = {"error": {"message": denied.message, "type": "auth_error", "code": code}}
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    return middleware


def http_auth(auth: AuthSettings, policy: Policy, clock: Callable[[], float]) -> list[Any]:
    """``[auth_middleware]`` when ``auth.enabled``, else ``[]``; StartupError for a tokens
    file that cannot be read."""
    if not auth.enabled or auth.tokens_file is None:
        return []
    try:
        tokens = TokenFile(auth.tokens_file, clock)
    except ValueError as err:
        raise StartupError(str(err)) from err
    return [auth_middleware(policy, tokens, open_reads=auth.open_reads)]
