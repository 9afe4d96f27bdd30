"""Anthropic's Messages API through the gateway, driven by the real ``anthropic`` SDK, over
in-process simulated engines, in both forwarding modes: translated (the canonical chat
body to ``/v1/chat/completions``, the answer translated back) and native
(``native_apis={"messages"}``: the engines' own ``/v1/messages``). The model's tool calls
come from a fake chat upstream (the simulator never calls tools)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.common.admission import ClassSpec, QueueConfig
from services.common.scheduling import CoreLimits, EndpointSpec, build_core
from services.common.tokens import TokenPath
from services.scheduler.core.records import RequestContext
from services.scheduler.http.openai import Limits
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.engines import EngineFleet
from tests.helpers.keys import FakeKeyStore, fake_gate

pytestmark = pytest.mark.integration

MODEL = "tideserve-sim"
MODES = [
    pytest.param(frozenset(), id="translated"),
    pytest.param(frozenset({"messages"}), id="native"),
]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[EngineFleet]:
    f = EngineFleet(tmp_path, profile="test", speedup=50.0)
    yield f
    await f.close()


Up = Callable[..., Awaitable[tuple[Gateway, str, list[RequestContext]]]]


@pytest.fixture
async def up(fleet: EngineFleet) -> AsyncIterator[Up]:
    """``up(n_engines, native_apis, **options)``: a gateway over ``n`` simulated engines; it
    returns the gateway, its URL and the contexts of finished requests."""
    servers: list[TestServer] = []

    async def make(
        n: int, native: frozenset[str], core_kw: dict[str, Any] | None = None, **kw: Any
    ) -> tuple[Gateway, str, list[RequestContext]]:
        specs = [EndpointSpec(f"e{i}", (await fleet.start())[1]) for i in range(n)]
        core = build_core(specs, perf_profile="test", **(core_kw or {}))
        kw.setdefault("background", False)
        opts = GatewayOptions(block_size=16, backoff_ms=1, native_apis=native, **kw)
        gw = Gateway(core, opts)
        done: list[RequestContext] = []
        gw.finished.append(lambda ctx, _end: done.append(ctx))
        server = TestServer(gw.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        await gw.poll_load()
        return gw, str(server.make_url("")).rstrip("/"), done

    yield make
    for s in servers:
        await s.close()


def client(url: str, **headers: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=url, api_key="unused", max_retries=0, default_headers=headers or None
    )


TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def tool_turns(n: int) -> list[Any]:
    """A conversation after ``n`` tool round trips, ending with the user's turn."""
    msgs: list[Any] = [{"role": "user", "content": "read the files one by one " * 20}]
    for i in range(n):
        msgs.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"reading f{i}"},
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": f"f{i}"}},
                ],
            }
        )  # fmt: skip
        msgs.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"contents of f{i} " * 10}],
            }
        )  # fmt: skip
    return msgs


@pytest.mark.parametrize("native", MODES)
async def test_create_stream_and_count_tokens(up: Up, native: frozenset[str]) -> None:
    _gw, url, done = await up(2, native)
    c = client(url)
    msg = await c.messages.create(
        model=MODEL,
        max_tokens=4,
        system="be brief",
        messages=[{"role": "user", "content": "hi there"}],
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 4
    async with c.messages.stream(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "stream this please"}]
    ) as s:
        text = "".join([t async for t in s.text_stream])
        final = await s.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    counted = await c.messages.count_tokens(
        model=MODEL, system="be brief", messages=[{"role": "user", "content": "hi there"}]
    )
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    assert counted.input_tokens == len(TokenPath().encode_chat(chat))
    assert [ctx.parsed.kind for ctx in done if ctx.parsed] == ["messages", "messages"]
    assert all(ctx.answer().usage is not None for ctx in done)
    assert done[0].answer().usage.completion_tokens == 4  # type: ignore[union-attr]


@pytest.mark.parametrize("native", MODES)
async def test_tool_loop_with_claude_code_headers_stays_and_hits_the_cache(
    up: Up, native: frozenset[str]
) -> None:
    """Three turns of a tool loop carrying only Claude Code's headers: one engine serves
    them all, and the 2nd and 3rd read the previous turns' prompt from its cache."""
    _gw, url, done = await up(3, native)
    c = client(url, **{"x-claude-code-session-id": "cc-sess-1"})
    reads = []
    for turn in range(3):
        msg = await c.messages.create(
            model=MODEL, max_tokens=3, tools=TOOLS, messages=tool_turns(turn)
        )
        assert msg.stop_reason == "max_tokens"
        reads.append(msg.usage.cache_read_input_tokens or 0)
    engines = {ctx.pick.decode.endpoint.instance_id for ctx in done if ctx.pick}
    assert len(engines) == 1, engines
    assert reads[1] > 0 and reads[2] > 0, reads
    assert {ctx.parsed.session_id for ctx in done if ctx.parsed} == {"cc-sess-1"}
    results = done[-1].parsed.tool_results if done[-1].parsed else ()
    assert [r.tool_call_id for r in results] == ["toolu_1"]


async def test_sub_agent_session_and_final_turn_release(up: Up) -> None:
    """A sub-agent's turn is its own session with the main session as parent; its final
    turn (``X-Tideserve-Session-Final: 1``) drops its sticky instance once answered."""
    gw, url, done = await up(2, frozenset(), profile="agent")
    hdrs = {"x-claude-code-session-id": "cc-main", "x-claude-code-agent-id": "agent-7"}
    msgs: list[Any] = [{"role": "user", "content": "go"}]
    affinity = [h for h in gw.core.scheduler.profiles["agent"].post_pick if hasattr(h, "sticky")]
    assert affinity
    await client(url, **hdrs).messages.create(model=MODEL, max_tokens=2, messages=msgs)
    p = done[0].parsed
    assert p is not None and (p.session_id, p.parent_session_id) == ("agent-7", "cc-main")
    assert all(h.sticky("agent-7", 0.0) for h in affinity)  # type: ignore[attr-defined]
    final = client(url, **hdrs, **{"X-Tideserve-Session-Final": "1"})
    await final.messages.create(model=MODEL, max_tokens=2, messages=msgs)
    assert all(h.sticky("agent-7", 0.0) is None for h in affinity)  # type: ignore[attr-defined]


@pytest.mark.parametrize("native", MODES)
async def test_errors_map_to_the_sdk_exceptions(up: Up, native: frozenset[str]) -> None:
    _gw, url, _ = await up(1, native, models=(MODEL,))
    c = client(url)
    with pytest.raises(anthropic.NotFoundError) as nf:
        await c.messages.create(
            model="nope", max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    with pytest.raises(anthropic.BadRequestError) as bad:
        await c.messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [image]}]
        )
    assert "image" in bad.value.message
    malformed = {"role": "user", "content": [{"type": "tool_result", "content": "no id"}]}
    with pytest.raises(anthropic.BadRequestError) as bad:
        await c.messages.create(model=MODEL, max_tokens=2, messages=[malformed])  # type: ignore[list-item]
    assert "tool_use_id" in bad.value.message


async def test_oversize_body_is_a_413_in_anthropic_shape(
    up: Up, http: aiohttp.ClientSession
) -> None:
    _gw, url, _ = await up(1, frozenset(), limits=Limits(max_body_bytes=2000))
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x " * 2000}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        async with http.post(url + path, json=body) as r:
            got = await r.json()
            assert r.status == 413, got
            assert got["type"] == "error" and got["error"]["type"] == "request_too_large"
    async with http.post(url + "/v1/messages", json={"model": MODEL, "messages": []}) as r:
        got = await r.json()
        assert r.status == 400 and got["error"]["type"] == "invalid_request_error", got


async def test_no_engine_is_503_and_admission_is_429(up: Up) -> None:
    _, url, _ = await up(0, frozenset())
    with pytest.raises(anthropic.APIStatusError) as err:
        await client(url).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.status_code == 503
    assert err.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    queue = QueueConfig(
        classes=(
            ClassSpec("interactive", 30, max_queue_ms=50, max_queued=0),
            ClassSpec("agent", 20),
        ),
        default_class="agent",
    )
    _gw, url, _ = await up(
        1,
        frozenset(),
        core_kw={"queue": queue, "limits": CoreLimits(max_in_flight_per_endpoint=0)},
        queue_tick_s=0.01,
    )
    c = client(url, **{"X-Tideserve-Class": "interactive"})
    with pytest.raises(anthropic.RateLimitError) as limited:
        await c.messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(limited.value.response.headers["Retry-After"]) >= 1


async def test_simulator_serves_messages_and_count_tokens(
    fleet: EngineFleet, http: aiohttp.ClientSession
) -> None:
    """The engine simulator's own ``/v1/messages`` (what native mode forwards to)."""
    _, url = await fleet.start()
    msgs = [{"role": "user", "content": "hello engine"}]
    c = client(url)
    msg = await c.messages.create(model=MODEL, max_tokens=3, messages=msgs)  # type: ignore[arg-type]
    assert msg.usage.output_tokens == 3 and msg.stop_reason == "max_tokens"
    counted = await c.messages.count_tokens(model=MODEL, messages=msgs)  # type: ignore[arg-type]
    assert counted.input_tokens == len(TokenPath().encode_chat(msgs))
    for path, body in [
        ("/v1/messages", {"model": MODEL, "messages": msgs}),
        ("/v1/messages/count_tokens", {"model": MODEL, "messages": "x"}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 10**9, "messages": msgs}),
    ]:
        async with http.post(url + path, json=body) as r:
            got = await r.json()
            assert r.status == 400 and got["type"] == "error", got
            assert got["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("native", MODES)
async def test_api_keys_on_the_messages_route(fleet: EngineFleet, native: frozenset[str]) -> None:
    """Keys on: Anthropic's ``x-api-key`` is accepted; a missing or unknown key is the SDK's
    AuthenticationError, a claimed foreign tenant its PermissionDeniedError."""
    store = FakeKeyStore()
    key = store.add("acme", ["agent"])
    _, engine = await fleet.start()
    core = build_core([EndpointSpec("e1", engine)], perf_profile="test")
    opts = GatewayOptions(background=False, block_size=16, native_apis=native)
    gw = Gateway(core, opts, keys=fake_gate(store))
    done: list[RequestContext] = []
    gw.finished.append(lambda ctx, _end: done.append(ctx))
    server = TestServer(gw.app(), host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        msgs: list[Any] = [{"role": "user", "content": "hello"}]
        ok = anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
        msg = await ok.messages.create(model=MODEL, max_tokens=2, messages=msgs)
        assert msg.usage.output_tokens == 2
        p = done[-1].parsed
        assert p is not None and p.tenant == "acme" and p.cache_salt
        bad = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ts-nope", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e401:
            await bad.messages.create(model=MODEL, max_tokens=2, messages=msgs)
        assert e401.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        foreign = anthropic.AsyncAnthropic(
            base_url=url, api_key=key, max_retries=0, default_headers={"X-Tideserve-Tenant": "x"}
        )
        with pytest.raises(anthropic.PermissionDeniedError) as e403:
            await foreign.messages.create(model=MODEL, max_tokens=2, messages=msgs)
        assert e403.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    finally:
        await server.close()


def _tool_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return f"data: {json.dumps({'id': 'c1', 'choices': [choice], **extra})}\n\n".encode()


ARGS = '{"path": "src/main.py"}'
TOOL_USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 9,
    "prompt_tokens_details": {"cached_tokens": 16},
}
TOOL_STREAM = [
    _tool_chunk({"role": "assistant", "content": "let me read it"}),
    _tool_chunk({"tool_calls": [{"index": 0, "id": "call_r", "type": "function", "function": {"name": "read_file", "arguments": ""}}]}),
    _tool_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[:9]}}]}),
    _tool_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[9:]}}]}),
    _tool_chunk({}, "tool_calls", usage=TOOL_USAGE),
    b"data: [DONE]\n\n",
]  # fmt: skip


async def tool_model(request: web.Request) -> web.StreamResponse:
    """A chat model that always calls read_file (the simulator never calls tools)."""
    body = await request.json()
    if not body.get("stream"):
        call = {
            "id": "call_r",
            "type": "function",
            "function": {"name": "read_file", "arguments": ARGS},
        }
        message = {"role": "assistant", "content": "let me read it", "tool_calls": [call]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        return web.json_response({"id": "c1", "choices": [choice], "usage": TOOL_USAGE})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in TOOL_STREAM:  # each event in two writes: chunks straddle events
        await resp.write(event[:17])
        await resp.write(event[17:])
    await resp.write_eof()
    return resp


async def test_tool_calls_come_back_as_tool_use_whole_and_streamed() -> None:
    up_app = web.Application()
    up_app.router.add_post("/v1/chat/completions", tool_model)
    upstream = TestServer(up_app, host="127.0.0.1")
    await upstream.start_server()
    core = build_core([EndpointSpec("m1", str(upstream.make_url("")).rstrip("/"))])
    gw = Gateway(core, GatewayOptions(background=False, block_size=16))
    done: list[RequestContext] = []
    gw.finished.append(lambda ctx, _end: done.append(ctx))
    server = TestServer(gw.app(), host="127.0.0.1")
    await server.start_server()
    try:
        c = client(str(server.make_url("")).rstrip("/"))
        kw: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 64,
            "tools": TOOLS,
            "messages": tool_turns(0),
        }
        whole = await c.messages.create(**kw)
        async with c.messages.stream(**kw) as s:
            streamed = await s.get_final_message()
        for msg in (whole, streamed):
            assert msg.stop_reason == "tool_use"
            text, use = msg.content
            assert text.type == "text" and text.text == "let me read it"
            assert use.type == "tool_use" and (use.id, use.name) == ("call_r", "read_file")
            assert use.input == {"path": "src/main.py"}
            assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens) == (14, 16)
            assert msg.usage.output_tokens == 9
        for ctx in done:  # recorded from the upstream's chat answer
            assert [t.name for t in ctx.answer().tool_calls] == ["read_file"]
            assert ctx.parsed is not None and ctx.parsed.tools_offered == 1
    finally:
        await server.close()
        await upstream.close()
