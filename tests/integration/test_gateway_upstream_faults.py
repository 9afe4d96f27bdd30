"""The gateway's upstream calls when an engine fails in the middle of something: a 5xx whose
body is cut is still a retryable :class:`UpstreamFailure` (not an aiohttp error escaping
as a plain-text 500), and cancelling a prefill half quietly never eats the caller's own
cancellation. Raw asyncio servers on 127.0.0.1 play the engine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from services.common.routing.types import EndpointView
from services.scheduler.http import upstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _engine(handler: Handler) -> AsyncIterator[EndpointView]:
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield EndpointView(instance_id="e1", url=f"http://127.0.0.1:{port}")
    finally:
        srv.close()
        await srv.wait_closed()


def _answers(head: bytes, body: bytes, cut: bool) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head + body)
        await writer.drain()
        if cut:
            writer.transport.abort()  # the engine dies before the body it announced
        else:
            writer.close()

    return handle


@pytest.mark.parametrize(
    ("body", "cut", "reason"),
    [
        (b'{"error": "overloaded"}', False, 'HTTP 503: {"error": "overloaded"}'),
        (b'{"err', True, "HTTP 503: (body unread: "),
    ],
    ids=["whole-body", "body-cut"],
)
async def test_a_5xx_is_an_upstream_failure_even_when_its_body_is_cut(
    body: bytes, cut: bool, reason: str
) -> None:
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n" % (
        len(body) + (50 if cut else 0)
    )
    async with _engine(_answers(head, body, cut)) as ep, aiohttp.ClientSession() as s:
        with pytest.raises(upstream.UpstreamFailure) as err:
            await upstream.open_upstream(
                s, ep, "/v1/completions", b"{}", {}, aiohttp.ClientTimeout(total=10)
            )
    assert (err.value.instance_id, err.value.status) == ("e1", 503)
    assert err.value.reason.startswith(reason)


async def _slow_to_cancel(release: asyncio.Event) -> None:
    """A task that, cancelled, still needs ``release`` before it ends (a prefill half
    closing its connection)."""
    try:
        await asyncio.Event().wait()
    finally:
        await release.wait()


@pytest.mark.parametrize("caller_cancelled", [False, True], ids=["quiet", "caller-cancelled"])
async def test_cancel_quietly_keeps_the_callers_own_cancellation(caller_cancelled: bool) -> None:
    release = asyncio.Event()
    task = asyncio.create_task(_slow_to_cancel(release))
    await asyncio.sleep(0)  # let it start
    caller = asyncio.create_task(upstream.cancel_quietly(task))
    await asyncio.sleep(0)  # the caller now waits for the task to end
    if caller_cancelled:
        caller.cancel()
    await asyncio.sleep(0)
    release.set()
    if caller_cancelled:
        with pytest.raises(asyncio.CancelledError):
            await caller
    else:
        assert await caller is None
    assert task.cancelled()
