"""The gateway's last line (``http/errors.internal_errors``): an exception no handler
expected is an OpenAI-style 500 with the request recorded as failed, not aiohttp's
plain-text 500; once the answer has started, the connection is cut instead; HTTP
exceptions pass through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.scheduler.core.records import RequestContext
from services.scheduler.http import records
from services.scheduler.http.errors import internal_errors

Fail = Callable[[web.Request], Awaitable[None]]


async def _raises_zero_division(_req: web.Request) -> None:
    _ = 1 / 0


async def _raises_not_found(_req: web.Request) -> None:
    raise web.HTTPNotFound(text="no such thing")


async def _started_then_raises(req: web.Request) -> None:
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    req[records.CONTEXT_KEY].answering(0.0, True)
    await out.prepare(req)
    await out.write(b"data: {}\n\n")
    raise RuntimeError("after the first byte")


async def _serve(fail: Fail, seen: list[Any]) -> TestServer:
    async def handler(req: web.Request) -> web.StreamResponse:
        await fail(req)
        return web.Response(text="unreachable")

    def finished(ctx: RequestContext, end: Any) -> None:
        seen.append((end.status, end.error))

    app = web.Application(middlewares=[records.request_contexts([finished]), internal_errors()])
    app.router.add_post("/v1/completions", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.mark.parametrize(
    ("fail", "status", "code"),
    [
        (_raises_zero_division, 500, "internal_error"),
        (_raises_not_found, 404, None),
    ],
    ids=["unexpected-exception", "http-exception"],
)
async def test_an_unexpected_exception_is_an_openai_style_500(
    fail: Fail, status: int, code: str | None
) -> None:
    seen: list[Any] = []
    server = await _serve(fail, seen)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(server.make_url("/v1/completions"), json={}) as r:
                assert r.status == status
                if code is not None:
                    body = await r.json()
                    assert body["error"]["code"] == code
                    assert "ZeroDivisionError" in body["error"]["message"]
    finally:
        await server.close()
    assert [st for st, _ in seen] == [status]


async def test_an_exception_after_the_answer_started_cuts_the_connection() -> None:
    seen: list[Any] = []
    server = await _serve(_started_then_raises, seen)
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientError):
                async with s.post(server.make_url("/v1/completions"), json={}) as r:
                    await r.read()
    finally:
        await server.close()
    assert seen and "RuntimeError" in seen[0][1]
