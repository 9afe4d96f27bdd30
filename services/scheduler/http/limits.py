"""Request-header limits of the gateway.

``max_header_bytes`` (the sum of every header's name and value) is checked by the
:func:`header_limit` middleware, first of all: over it → 431 with an OpenAI-style body.
aiohttp's own parser limits (:func:`parser_limits`: one header line or field at most
``max_header_bytes``) are the backstop for a single line too long to even parse; those get
a 400 (``line_too_long``) and a closed connection, answered before any middleware, in JSON
by :class:`services.common.http_errors.JsonErrorRunner`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from itertools import chain
from typing import Any

from aiohttp import web

from services.scheduler.http.openai import Limits, error_body

__all__ = ["header_limit", "parser_limits"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_AIOHTTP_DEFAULT = 8190


def parser_limits(limits: Limits) -> dict[str, Any]:
    """aiohttp ``handler_args``: per-line and per-field limits no lower than its defaults."""
    size = max(_AIOHTTP_DEFAULT, limits.max_header_bytes)
    return {"max_line_size": size, "max_field_size": size}


def header_limit(max_bytes: int) -> Any:
    """The middleware answering 431 when the request's headers exceed ``max_bytes``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        size = sum(map(len, chain.from_iterable(request.raw_headers)))
        if size > max_bytes:
            body = error_body(
                f"request headers of {size} bytes are over the limit of {max_bytes}",
                "invalid_request_error",
                None,
                "headers_too_large",
            )
            return web.json_response(body, status=431)
        return await handler(request)

    return middleware
