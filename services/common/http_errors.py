"""Every error of an aiohttp server as a JSON body in the APIs' error shape, echoing nothing.

The shape is OpenAI's, ``{"error": {"message", "type", "param", "code"}}``, with fixed
messages: nothing of the request (header bytes, path, method) is sent back.

Two places answer errors in aiohttp:

- the app's router and request helpers raise :class:`aiohttp.web.HTTPException` (404 for an
  unknown path, 405 for a wrong method, 413 for a body over ``client_max_size``...), which
  the :func:`json_errors` middleware turns into JSON (headers such as ``Allow`` kept);
- the connection itself, before any middleware, for a request it cannot parse (a line or
  header field over ``max_line_size``/``max_field_size``, garbage, TLS on a plain port) and
  for an exception or timeout that escaped every middleware. aiohttp answers those in plain
  text with the parser's message, which quotes the offending bytes. It has no public hook
  for them, so :class:`JsonErrorRunner` (an ``AppRunner``) serves connections with a
  protocol whose :meth:`~aiohttp.web_protocol.RequestHandler.handle_error` answers JSON;
  its log line names the error's class, not its bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadStatusLine, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

__all__ = ["JsonErrorRunner", "error_response", "json_errors"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger(__name__)

# status → (message, code); the type follows from the status (:func:`_etype`).
_KNOWN: dict[int, tuple[str, str]] = {
    400: ("the request is not valid HTTP", "invalid_http_request"),
    404: ("no such route", "not_found"),
    405: ("method not allowed on this route", "method_not_allowed"),
    408: ("the request took too long to arrive", "request_timeout"),
    413: ("request body too large", "body_too_large"),
    414: ("request URI too long", "uri_too_long"),
    431: ("request headers too large", "headers_too_large"),
    500: ("internal error; the server logged it", "internal_error"),
    503: ("service unavailable", "service_unavailable"),
    504: ("the request timed out in the server", "timeout"),
}
# Headers of an HTTPException that still mean something on the JSON answer.
_KEEP = ("Allow", "Retry-After", "WWW-Authenticate")


def _etype(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_response(status: int, message: str = "", code: str = "") -> web.Response:
    """A JSON error answer; ``message``/``code`` default to fixed ones for the status."""
    known = _KNOWN.get(status)
    if known is None:
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        known = (phrase.lower() or "error", phrase.lower().replace(" ", "_") or "error")
    body = {
        "error": {
            "message": message or known[0],
            "type": _etype(status),
            "param": None,
            "code": code or known[1],
        }
    }
    return web.json_response(body, status=status)


def json_errors() -> Any:
    """The middleware answering every ``HTTPException`` of 400 and up in JSON (put it
    first, outermost: the middlewares inside it see the exception as before)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            message = ""
            if isinstance(e, web.HTTPMethodNotAllowed):  # our own routes: safe to name
                allowed = ", ".join(sorted(e.allowed_methods))
                message = f"method not allowed on this route (allowed: {allowed})"
            resp = error_response(e.status, message)
            for name in _KEEP:
                if name in e.headers:
                    resp.headers[name] = e.headers[name]
            return resp

    return middleware


def _low_level(status: int, exc: BaseException | None) -> web.Response:
    """The answer to an error the connection handles itself."""
    if isinstance(exc, LineTooLong):
        msg = "a request line or header field is longer than the server accepts"
        return error_response(400, msg, "line_too_long")
    if isinstance(exc, BadStatusLine):
        return error_response(400, "the request line is not valid HTTP", "invalid_http_request")
    return error_response(status)


class _JsonErrorProtocol(RequestHandler):
    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's, answering JSON (:func:`_low_level`) and logging no request bytes."""
        if status >= 500:
            self.log_exception("error handling a request", exc_info=exc)
        else:
            log.info("refused an unparseable request (%s)", type(exc).__name__)
        if request.writer.output_size > 0:  # as aiohttp: the answer started, cut it
            raise ConnectionError("the answer had started; cannot send an error instead")
        resp = _low_level(status, exc)
        resp.force_close()
        return resp


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorProtocol(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """An ``AppRunner`` whose connections answer their own errors in JSON (see the module
    docstring); otherwise the same (``handler_args``, access log, signals)."""

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        return _JsonErrorServer(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            **base._kwargs,
        )
