"""The gateway's error answers, all OpenAI-style: :class:`Overloaded` (429), the answer
to an :class:`~services.scheduler.http.openai.ApiError` (:func:`error_response`, with
``Retry-After`` when the client should come back), and the last line,
:func:`internal_errors`: an exception no handler expected becomes a 500.

aiohttp answers an unhandled exception with a plain-text ``500 Internal Server Error``,
which OpenAI clients cannot parse. :func:`internal_errors` (the innermost middleware) logs
the traceback and answers ``{"error": {..., "code": "internal_error"}}`` instead, unless
the answer had already started (then the connection is cut, as before: a new status line
cannot follow a streamed one). It is a net, not a handler: each such answer is a bug, and
the chaos suite fails on any.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from services.scheduler.core.intake import Refused
from services.scheduler.http import records
from services.scheduler.http.openai import ApiError
from services.scheduler.keys.gate import RateLimited

__all__ = ["Overloaded", "api_error", "error_response", "internal_errors"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger(__name__)


class Overloaded(ApiError):
    """429; ``where``: admission (queue full / deadline passed), queue_timeout, routing."""

    def __init__(self, message: str, retry_after_ms: int, where: str = "admission") -> None:
        super().__init__(429, message, None, "overloaded", "rate_limit_error")
        self.retry_after_ms = retry_after_ms
        self.where = where


def api_error(r: Refused) -> ApiError:
    """``overloaded`` → 429 (with a retry hint), ``unavailable`` (no engine can serve) →
    503, ``unknown`` → 400."""
    if r.kind == "overloaded":
        return Overloaded(r.message, r.retry_after_ms, r.where)
    if r.kind == "unavailable":
        return ApiError(503, r.message, None, "no_endpoint", "service_unavailable")
    return ApiError(400, r.message, r.param or None)


def error_response(e: ApiError) -> web.Response:
    resp = web.json_response(e.body(), status=e.status)
    if isinstance(e, Overloaded | RateLimited):
        resp.headers["Retry-After"] = str(max(1, math.ceil(e.retry_after_ms / 1000)))
        resp.headers["Retry-After-Ms"] = str(e.retry_after_ms)
    return resp


def internal_errors() -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as e:
            ctx = request.get(records.CONTEXT_KEY)
            log.exception("internal error on %s %s", request.method, request.path)
            if ctx is not None and ctx.first_byte is not None:
                raise  # the answer started: cut it
            message = f"internal error ({type(e).__name__}); the gateway logged it"
            return error_response(ApiError(500, message, None, "internal_error", "server_error"))

    return middleware
