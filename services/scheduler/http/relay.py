"""Relaying an opened upstream answer to the client (aiohttp I/O only).

:func:`relay_body` hands back a whole (non-streamed or non-200) answer; :func:`relay_stream`
passes an SSE stream through chunk by chunk. Both call ``first_byte(pick_id)`` once, before
the first byte goes to the client and before any await after it (from then on the request
can no longer be pre-empted), and report the upstream's health to the fleet.

Before the first byte, a read error or an empty stream raises
:class:`~services.scheduler.http.upstream.UpstreamFailure` (the caller may retry on
another endpoint). After it, a broken stream or one that ends without ``[DONE]`` ends the
client's stream with an OpenAI-style error event and ``data: [DONE]``; the endpoint is
marked failed. A client that goes away stops the relay (recorded as cancelled).

With an :class:`AnswerTranslator` (a client speaking another API than the engine answers
in: Anthropic Messages or OpenAI Responses over chat completions, or an engine's native
answer relayed under the gateway's ids) the client gets the translator's bytes instead, its
error event for a broken stream (:meth:`AnswerTranslator.fail`), and its last bytes
(:meth:`AnswerTranslator.end`) once the upstream stream ended; the record still reads the
upstream's. What the translator gives for the chunk that ends the upstream stream is held and
sent with those last bytes and the stream's terminator, in one write (a short answer arrives
whole, so that is most of its bytes).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Protocol

import aiohttp
from aiohttp import web

from services.common.scheduling.service import GatewayCore
from services.scheduler.core.records import RequestContext
from services.scheduler.http import upstream
from services.scheduler.http.metrics import GatewayMetrics

__all__ = ["AnswerTranslator", "FirstByte", "relay_body", "relay_stream"]

FirstByte = Callable[[str], None]
"""``first_byte(pick_id)``: the answer of ``pick_id`` starts reaching the client."""


class AnswerTranslator(Protocol):
    """The client speaks another API than the engine answers in (Messages or Responses over
    chat completions), or the engine's native answer is relayed in the client's terms: the
    upstream path, and the client's bytes of each upstream answer. The request record reads
    the upstream bytes, unless the translator parses every chunk and keeps what the record
    needs (``RequestContext.facts``)."""

    @property
    def path(self) -> str: ...

    @property
    def done(self) -> bool:
        """The upstream stream reached its end (what ``[DONE]`` says for chat)."""
        ...

    async def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        """The client's status and body of a whole answer (after the first byte)."""
        ...

    def feed(self, chunk: bytes) -> bytes:
        """The client's bytes of an upstream stream chunk."""
        ...

    def fail(self, message: str) -> bytes:
        """The client's error event for an upstream stream that broke with ``message``."""
        ...

    async def end(self) -> bytes:
        """The client's last bytes, once the upstream stream ended (or broke)."""
        ...


async def relay_body(
    ctx: RequestContext,
    resp: aiohttp.ClientResponse,
    instance_id: str,
    pick_id: str,
    *,
    core: GatewayCore,
    clock: Callable[[], float],
    first_byte: FirstByte,
    answer: AnswerTranslator | None = None,
) -> web.Response:
    """The whole upstream answer, status and content type unchanged (``answer``: as it
    translates it)."""
    try:
        data = await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise upstream.UpstreamFailure(instance_id, f"read: {e!r}") from None
    first_byte(pick_id)
    now = clock()
    ctx.whole(now, data)
    core.fleet.upstream_result(instance_id, True, now)
    if answer is not None:
        status, data = await answer.whole(resp.status, data)
        return web.Response(status=status, body=data, content_type="application/json")
    return web.Response(
        status=resp.status, body=data, content_type=resp.content_type or "application/json"
    )


async def relay_stream(
    req: web.Request,
    ctx: RequestContext,
    resp: aiohttp.ClientResponse,
    instance_id: str,
    pick_id: str,
    *,
    core: GatewayCore,
    clock: Callable[[], float],
    metrics: GatewayMetrics,
    first_byte: FirstByte,
    answer: AnswerTranslator | None = None,
) -> web.StreamResponse:
    """The upstream SSE stream, token by token (see the module docstring for failures;
    ``answer``: as it translates it)."""
    out = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    started = False
    tail = b""
    held = b""  # translated bytes of the chunk that ended the stream: sent with the last ones
    error = ""
    try:
        async for chunk in resp.content.iter_any():
            if not started:
                first_byte(pick_id)  # before any await: no pre-emption from here
                started = True
                try:
                    await out.prepare(req)
                except (ConnectionError, RuntimeError):
                    return _client_gone(ctx, core, instance_id, clock(), out)
                ctx.answering(clock(), True)
            ctx.chunk(chunk)
            data = chunk
            if answer is not None:
                data = answer.feed(chunk)
                if answer.done:
                    held, data = held + data, b""
            try:
                if data:
                    await out.write(data)
            except (ConnectionError, RuntimeError):
                return _client_gone(ctx, core, instance_id, clock(), out)
            tail = (tail + chunk)[-64:]
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        if not started:
            raise upstream.UpstreamFailure(instance_id, f"stream: {e!r}") from None
        error = f"upstream stream broke: {e!r}"
    if not started:
        raise upstream.UpstreamFailure(instance_id, "empty stream")
    ended = answer.done if answer is not None else b"[DONE]" in tail
    if not error and not ended:
        error = "upstream stream ended without [DONE]"
    now = clock()
    if error:
        metrics.upstream_failed(instance_id, "stream broken", False)
        ctx.error = error
        core.fleet.upstream_result(instance_id, False, now)
        evt = {
            "error": {
                "message": error,
                "type": "server_error",
                "param": None,
                "code": "upstream_error",
            }
        }
        last = f"data: {json.dumps(evt)}\n\ndata: [DONE]\n\n".encode()
        held += answer.fail(error) if answer is not None else last
    else:
        core.fleet.upstream_result(instance_id, True, now)
    with contextlib.suppress(ConnectionError, RuntimeError):
        if answer is not None:
            held += await answer.end()
        await out.write_eof(held)  # one write with the stream's terminator
    return out


def _client_gone(
    ctx: RequestContext, core: GatewayCore, instance_id: str, now: float, out: web.StreamResponse
) -> web.StreamResponse:
    """The client went away: the relay stops reading upstream (counted as cancelled; the
    engine did nothing wrong)."""
    ctx.cancelled = True
    core.fleet.upstream_result(instance_id, True, now)
    return out
