"""Agent tool calls on record through the real gateway path: an OpenAI-compatible upstream
that answers with tool calls (whole and streamed in small writes, as a model server does;
the engine simulator never calls tools), the gateway relaying it, and the RequestRecord on
a real Redis stream carrying the turn's tools offered, tool results and tool calls."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tideserve.v1 import events_pb2

from services.common.scheduling import EndpointSpec, build_core
from services.common.streams import decode_entry
from services.scheduler.feeds.record_sink import RecordSink
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.records import record_requests
from services.scheduler.http.server import Gateway

pytestmark = pytest.mark.integration

ARGS = '{"path": "src/main.py"}'
USAGE = {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    evt = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}  # fmt: skip
    return f"data: {json.dumps(evt)}\n\n".encode()


STREAM = [
    _chunk({"role": "assistant", "content": None}),
    _chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_r",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": ""},
                }
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[:9]}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[9:]}}]}),
    _chunk({}, "tool_calls", usage=USAGE),
    b"data: [DONE]\n\n",
]


async def fake_model(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_w", "type": "function", "function": {"name": "write_file", "arguments": ARGS}}
            ],
        }  # fmt: skip
        return web.json_response(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": USAGE,
            }
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in STREAM:  # split each event in two writes: chunks straddle events
        await resp.write(event[:17])
        await resp.write(event[17:])
    await resp.write_eof()
    return resp


Make = Callable[[bool], Awaitable[tuple[str, RecordSink]]]


@pytest.fixture
async def gateway(redis_client: Any) -> AsyncIterator[Make]:
    servers: list[TestServer] = []
    sinks: list[RecordSink] = []

    async def make(contents: bool) -> tuple[str, RecordSink]:
        up = web.Application()
        up.router.add_post("/v1/chat/completions", fake_model)
        us = TestServer(up, host="127.0.0.1")
        await us.start_server()
        servers.append(us)
        core = build_core([EndpointSpec("m1", str(us.make_url("")).rstrip("/"))], block_size=16)
        opts = GatewayOptions(
            background=False, block_size=16, models=("coder",), record_tool_contents=contents
        )
        gw = Gateway(core, opts)
        sink = RecordSink(redis_client, f"ts:requests:{uuid.uuid4().hex[:6]}", flush_s=0.01)
        sinks.append(sink)
        gw.finished.append(record_requests(sink, deployment="dep"))
        gs = TestServer(gw.app(), host="127.0.0.1")
        await gs.start_server()
        servers.append(gs)
        return str(gs.make_url("")).rstrip("/"), sink

    yield make
    for s in sinks:
        await s.stop()
    for srv in servers:
        await srv.close()


TURN = {
    "model": "coder",
    "tools": [
        {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}},
    ],
    "messages": [
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "print('hello')"},
    ],
    "max_tokens": 16,
}  # fmt: skip


@pytest.mark.parametrize(
    ("stream", "contents", "call"),
    [
        (True, False, ("call_r", "read_file", len(ARGS), "")),
        (True, True, ("call_r", "read_file", len(ARGS), ARGS)),
        (False, False, ("call_w", "write_file", len(ARGS), "")),
    ],
    ids=["streamed", "streamed-with-contents", "whole"],
)
async def test_tool_calls_are_recorded(
    gateway: Make, redis_client: Any, stream: bool, contents: bool, call: tuple[Any, ...]
) -> None:
    url, sink = await gateway(contents)
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/chat/completions", json={**TURN, "stream": stream}) as r:
            assert r.status == 200
            await r.read()
    await sink.flush()
    entries = await redis_client.xrange(sink.stream)
    (rec,) = [decode_entry(f, events_pb2.RequestRecord) for _, f in entries]
    assert rec.tools_offered == 2
    assert [(t.tool_call_id, t.name, t.content_bytes, t.content) for t in rec.tool_results] == [
        ("call_0", "read_file", 14, "print('hello')" if contents else "")
    ]
    assert [(c.id, c.name, c.argument_bytes, c.arguments) for c in rec.tool_calls] == [call]
    assert (rec.prompt_tokens, rec.completion_tokens) == (30, 9)
