"""The Responses API through the gateway, driven by the real ``openai`` SDK: the gateway
over in-process simulated engines (chat translation and native ``/v1/responses``), stored
responses in real Postgres shared by two gateway replicas."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.common import db
from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.core.records import RequestContext, build_record
from services.scheduler.http.openai import Limits
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.records import Ending
from services.scheduler.http.server import Gateway
from services.scheduler.keys.gate import KeyGate
from services.scheduler.responses.chain import StoredResponse
from services.scheduler.responses.store import PostgresResponseStore
from tests.helpers.engines import EngineFleet
from tests.helpers.keys import FakeKeyStore, fake_gate

pytestmark = pytest.mark.integration

MODEL = "tideserve-sim"
PROMPT = " ".join(f"w{i}" for i in range(40))
Make = Callable[..., Awaitable[tuple[Gateway, openai.AsyncOpenAI]]]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[EngineFleet]:
    f = EngineFleet(tmp_path, profile="test", speedup=50.0, block_size=16)
    yield f
    await f.close()


@pytest.fixture
def pg(postgres_db_url: str) -> str:
    db.migrate(postgres_db_url, "scheduler")
    return postgres_db_url


@pytest.fixture
async def gateways() -> AsyncIterator[Make]:
    servers: list[TestServer] = []
    clients: list[openai.AsyncOpenAI] = []

    async def make(
        urls: list[str],
        store_url: str | None = None,
        *,
        keys: KeyGate | None = None,
        api_key: str = "unused",
        wall: Callable[[], float] = time.time,
        **opts: Any,
    ) -> tuple[Gateway, openai.AsyncOpenAI]:
        specs = [EndpointSpec(f"e{i}", u) for i, u in enumerate(urls)]
        core = build_core(specs, block_size=16, perf_profile="test")
        options = GatewayOptions(background=False, block_size=16, backoff_ms=1, **opts)
        store = PostgresResponseStore(store_url) if store_url else None
        gw = Gateway(core, options, response_store=store, keys=keys, wall=wall)
        server = TestServer(gw.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        await gw.poll_load()
        base = str(server.make_url("")).rstrip("/") + "/v1"
        client = openai.AsyncOpenAI(base_url=base, api_key=api_key, max_retries=0)
        clients.append(client)
        return gw, client

    yield make
    for c in clients:
        await c.close()
    for s in servers:
        await s.close()


MODES = [pytest.param((), id="translated"), pytest.param(("responses",), id="native")]


@pytest.mark.parametrize("native", MODES)
async def test_create_stream_retrieve_delete(
    fleet: EngineFleet, gateways: Make, pg: str, native: tuple[str, ...]
) -> None:
    _, url = await fleet.start()
    _, client = await gateways([url], pg, native_apis=native)
    r = await client.responses.create(
        model=MODEL, input=PROMPT, instructions="be brief", max_output_tokens=5
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.to_dict()["store"] is True
    assert r.output_text and r.output[0].type == "message"
    assert r.usage is not None and r.usage.output_tokens == 5 and r.usage.input_tokens > 40
    assert r.status == "incomplete"  # the simulator always stops on length
    stream = await client.responses.create(
        model=MODEL, input=PROMPT, max_output_tokens=5, stream=True
    )
    events = [e async for e in stream]
    final = events[-1].response  # type: ignore[union-attr]
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert kinds[-2:] == ["response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text and final.id.startswith("resp_")
    got = await client.responses.retrieve(final.id)
    assert got.id == final.id and got.output_text == text
    deleted = await client.delete(f"/responses/{final.id}", cast_to=object)
    assert deleted == {"id": final.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(final.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_nope")
    with pytest.raises(openai.APIStatusError) as unimplemented:
        await client.responses.input_items.list(final.id)
    assert unimplemented.value.status_code == 501


@pytest.mark.parametrize("native", MODES)
async def test_previous_response_id_across_two_replicas(
    fleet: EngineFleet, gateways: Make, pg: str, native: tuple[str, ...]
) -> None:
    _, url = await fleet.start()
    _, a = await gateways([url], pg, native_apis=native)
    _, b = await gateways([url], pg, native_apis=native)
    t1 = await a.responses.create(model=MODEL, input=PROMPT, max_output_tokens=4)
    t2 = await b.responses.create(
        model=MODEL, input="and more", previous_response_id=t1.id, max_output_tokens=4
    )
    assert t2.previous_response_id == t1.id
    assert t1.usage is not None and t2.usage is not None
    # turn 2's prompt is turn 1's prompt, its answer, then the new input
    assert t2.usage.input_tokens == t1.usage.input_tokens + 1 + 4 + 3
    assert t2.usage.input_tokens_details.cached_tokens > 0
    again = await a.responses.retrieve(t2.id)
    assert again.previous_response_id == t1.id


async def test_unknown_previous_response_and_bad_input_are_refused(
    fleet: EngineFleet, gateways: Make, pg: str
) -> None:
    _, url = await fleet.start()
    _, client = await gateways([url], pg, limits=Limits(max_body_bytes=4096))
    t1 = await client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")
    assert err.value.code == "previous_response_not_found"
    assert err.value.param == "previous_response_id"
    bad: list[Any] = [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=MODEL, input=bad, previous_response_id=t1.id)
    assert err.value.code == "unsupported_content"
    with pytest.raises(openai.APIStatusError) as big:
        await client.responses.create(model=MODEL, input="w " * 5000)
    assert big.value.status_code == 413
    # nothing already stored was lost: turn 1 still reads and continues
    assert (await client.responses.retrieve(t1.id)).id == t1.id
    t2 = await client.responses.create(model=MODEL, input="on", previous_response_id=t1.id)
    assert t2.previous_response_id == t1.id


async def test_store_failure_keeps_stored_responses(
    fleet: EngineFleet, gateways: Make, pg: str, postgres_db_url: str
) -> None:
    _, url = await fleet.start()
    _, good = await gateways([url], pg)
    t1 = await good.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    broken = postgres_db_url.rsplit("/", 1)[0] + "/no_such_database"
    _, bad = await gateways([url], broken)
    with pytest.raises(openai.InternalServerError) as err:
        await bad.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    assert err.value.code == "store_failed"
    stream = await bad.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2, stream=True)
    kinds = [e.type async for e in stream]
    assert kinds[-1] == "response.failed"
    # store: false never touches the store
    r = await bad.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2, store=False)
    assert r.to_dict()["store"] is False and r.output_text
    assert (await good.responses.retrieve(t1.id)).output_text == t1.output_text


async def test_without_a_store(fleet: EngineFleet, gateways: Make) -> None:
    _, url = await fleet.start()
    _, client = await gateways([url])
    r = await client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    assert r.to_dict()["store"] is False
    for kw in ({"store": True}, {"previous_response_id": r.id}):
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(model=MODEL, input="x", **kw)
        assert err.value.code == "store_unavailable"


async def test_tenants_see_only_their_own_responses(
    fleet: EngineFleet, gateways: Make, pg: str
) -> None:
    _, url = await fleet.start()
    keys = FakeKeyStore()
    key_a, key_b = keys.add("a"), keys.add("b")
    _, a = await gateways([url], pg, keys=fake_gate(keys), api_key=key_a)
    _, b = await gateways([url], pg, keys=fake_gate(keys), api_key=key_b)
    t1 = await a.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        await b.responses.retrieve(t1.id)
    with pytest.raises(openai.NotFoundError):
        await b.delete(f"/responses/{t1.id}", cast_to=object)
    with pytest.raises(openai.BadRequestError) as err:
        await b.responses.create(model=MODEL, input="x", previous_response_id=t1.id)
    assert err.value.code == "previous_response_not_found"
    assert (await a.responses.retrieve(t1.id)).id == t1.id


class Wall:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


async def test_expired_responses_are_never_served_and_are_swept(
    fleet: EngineFleet, gateways: Make, pg: str
) -> None:
    _, url = await fleet.start()
    wall = Wall()
    gw, client = await gateways([url], pg, wall=wall, responses_retention_s=60.0)
    t1 = await client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    wall.t += 30
    assert (await client.responses.retrieve(t1.id)).id == t1.id
    wall.t += 31
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(t1.id)
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=MODEL, input="x", previous_response_id=t1.id)
    assert err.value.code == "previous_response_not_found"
    store = gw.responses.store
    assert store is not None and await store.get(t1.id, 0.0) is not None  # still a row
    await gw.responses.sweep()
    assert await store.get(t1.id, 0.0) is None


async def test_multi_turn_loop_stays_on_one_engine_and_hits_the_cache(
    fleet: EngineFleet, gateways: Make, pg: str
) -> None:
    urls = [(await fleet.start())[1] for _ in range(3)]
    gw, client = await gateways(urls, pg)
    picked: list[str] = []
    gw.finished.append(
        lambda ctx, _end: picked.append(ctx.pick.decode.endpoint.instance_id if ctx.pick else "")
    )
    prev: str | None = None
    cached: list[int] = []
    for turn in range(4):
        kw: dict[str, Any] = {"previous_response_id": prev} if prev else {}
        r = await client.responses.create(
            model=MODEL, input=f"{PROMPT} turn{turn}", max_output_tokens=8, **kw
        )
        assert r.usage is not None
        cached.append(r.usage.input_tokens_details.cached_tokens)
        prev = r.id
    assert len(set(picked)) == 1, picked
    assert all(c > 0 for c in cached[1:]), cached


# -- function calls (an upstream that calls tools; the simulator never does) ----------------
def recorded(gw: Gateway) -> list[Any]:
    """The request records of ``gw``'s finished requests, as they go to Redis."""
    out: list[Any] = []

    def keep(ctx: RequestContext, end: Ending) -> None:
        out.append(
            build_record(
                ctx,
                status=end.status,
                finish=end.finish,
                finish_wall=end.finish_wall,
                deployment="d",
            )
        )

    gw.finished.append(keep)
    return out


ARGS = '{"path": "a.py"}'


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    evt = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(evt)}\n\n".encode()


USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 9,
    "prompt_tokens_details": {"cached_tokens": 16},
}
CALL = {
    "index": 0,
    "id": "call_1",
    "type": "function",
    "function": {"name": "read", "arguments": ""},
}
TOOL_STREAM = [
    _chunk({"role": "assistant", "content": "let me look"}),
    _chunk({"tool_calls": [CALL]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[:7]}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[7:]}}]}),
    _chunk({}, "tool_calls", usage=USAGE),
    b"data: [DONE]\n\n",
]


async def test_function_call_round_trip(gateways: Make, pg: str) -> None:
    seen: list[dict[str, Any]] = []

    async def model(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if body["messages"][-1]["role"] == "tool":
            msg = {"role": "assistant", "content": "done"}
            answer = {
                "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                "usage": USAGE,
            }
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in TOOL_STREAM:  # events straddle writes
            await resp.write(event[:11])
            await resp.write(event[11:])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", model)
    up = TestServer(app, host="127.0.0.1")
    await up.start_server()
    try:
        gw, client = await gateways([str(up.make_url("")).rstrip("/")], pg, models=(MODEL,))
        records = recorded(gw)
        tools: list[Any] = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
        async with client.responses.stream(model=MODEL, input="read a.py", tools=tools) as s:
            kinds = [e.type async for e in s]
            first = await s.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
        assert (
            "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
        )
        call = first.output[1]
        assert call.type == "function_call" and call.call_id == "call_1" and call.arguments == ARGS
        assert first.usage is not None and first.usage.input_tokens_details.cached_tokens == 16
        out: list[Any] = [{"type": "function_call_output", "call_id": "call_1", "output": "x = 1"}]
        second = await client.responses.create(
            model=MODEL, input=out, tools=tools, previous_response_id=first.id
        )
        assert second.output_text == "done"
        msgs = seen[-1]["messages"]
        assert msgs[1] == {
            "role": "assistant",
            "content": "let me look",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read", "arguments": ARGS},
                }
            ],
        }
        assert msgs[2] == {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"}
        assert [r.api for r in records] == ["responses", "responses"]
        assert [c.name for c in records[0].tool_calls] == ["read"]
        assert records[0].cached_tokens == 16 and records[0].completion_tokens == 9
        assert [t.tool_call_id for t in records[1].tool_results] == ["call_1"]
        assert seen[-1]["tools"][0] == {
            "type": "function",
            "function": {"name": "read", "parameters": {"type": "object"}},
        }
    finally:
        await up.close()


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **fields})}\n\n".encode()


FC = {
    "id": "fc_e",
    "type": "function_call",
    "call_id": "call_1",
    "name": "read",
    "arguments": ARGS,
    "status": "completed",
}
R_USAGE = {
    "input_tokens": 30,
    "output_tokens": 9,
    "input_tokens_details": {"cached_tokens": 16},
    "total_tokens": 39,
}
ENGINE_RESP = {
    "id": "resp_engine",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": MODEL,
    "output": [FC],
    "usage": R_USAGE,
    "store": False,
}
NATIVE_STREAM = [
    _event("response.created", 0, response={**ENGINE_RESP, "status": "in_progress", "output": [], "usage": None}),
    _event("response.output_item.added", 1, output_index=0, item={**FC, "arguments": "", "status": "in_progress"}),
    _event("response.function_call_arguments.delta", 2, item_id="fc_e", output_index=0, delta=ARGS[:5]),
    _event("response.function_call_arguments.delta", 3, item_id="fc_e", output_index=0, delta=ARGS[5:]),
    _event("response.function_call_arguments.done", 4, item_id="fc_e", output_index=0, arguments=ARGS),
    _event("response.output_item.done", 5, output_index=0, item=FC),
    _event("response.completed", 6, response=ENGINE_RESP),
]  # fmt: skip


async def test_native_function_call_round_trip(gateways: Make, pg: str) -> None:
    seen: list[dict[str, Any]] = []

    async def engine(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if not body.get("stream"):
            msg = {"id": "msg_e", "type": "message", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "done", "annotations": []}]}  # fmt: skip
            return web.json_response({**ENGINE_RESP, "output": [msg]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in NATIVE_STREAM:
            await resp.write(event[:9])
            await resp.write(event[9:])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/responses", engine)
    up = TestServer(app, host="127.0.0.1")
    await up.start_server()
    try:
        url = str(up.make_url("")).rstrip("/")
        gw, client = await gateways([url], pg, models=(MODEL,), native_apis=("responses",))
        records = recorded(gw)
        tools: list[Any] = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
        async with client.responses.stream(model=MODEL, input="read a.py", tools=tools) as s:
            kinds = [e.type async for e in s]
            first = await s.get_final_response()
        assert kinds[-1] == "response.completed" and first.id.startswith("resp_")
        assert first.id != "resp_engine" and first.output[0].type == "function_call"
        out: list[Any] = [{"type": "function_call_output", "call_id": "call_1", "output": "x = 1"}]
        second = await client.responses.create(
            model=MODEL, input=out, tools=tools, previous_response_id=first.id
        )
        assert second.output_text == "done" and second.previous_response_id == first.id
        sent = seen[-1]
        assert sent["store"] is False and "previous_response_id" not in sent
        assert [i["type"] for i in sent["input"]] == [
            "message",
            "function_call",
            "function_call_output",
        ]
        assert sent["input"][1]["call_id"] == "call_1" and sent["input"][1]["arguments"] == ARGS
        assert sent["tools"] == tools
        assert [r.api for r in records] == ["responses", "responses"]
        assert [c.name for c in records[0].tool_calls] == ["read"]
        assert records[0].cached_tokens == 16 and records[0].prompt_tokens == 30
        assert (await client.responses.retrieve(first.id)).output[0].type == "function_call"
    finally:
        await up.close()


# Strings JSON can carry and Postgres JSONB cannot: a NUL (a tool that printed a binary file)
# and a lone surrogate (an escape a client's encoder wrote for a broken character).
AWKWARD = [
    pytest.param("bytes\x00in a tool's output", id="nul"),
    pytest.param("half a pair \ud83d here", id="lone-surrogate"),
]


async def test_a_nul_in_a_tool_output_is_stored_and_continued(
    fleet: EngineFleet, gateways: Make, pg: str
) -> None:
    _, url = await fleet.start()
    _, client = await gateways([url], pg)
    call: list[Any] = [
        {"type": "function_call", "call_id": "c1", "name": "cat", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "bytes\x00of a binary"},
    ]
    t1 = await client.responses.create(model=MODEL, input=call, max_output_tokens=2)
    t2 = await client.responses.create(
        model=MODEL, input="go on", previous_response_id=t1.id, max_output_tokens=2
    )
    assert t2.previous_response_id == t1.id


async def test_a_lone_surrogate_in_the_input_is_refused_and_nothing_is_lost(
    fleet: EngineFleet, gateways: Make, pg: str
) -> None:
    _, url = await fleet.start()
    _, client = await gateways([url], pg)
    t1 = await client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2)
    body = {"model": MODEL, "input": "half a pair \ud83d", "previous_response_id": t1.id}
    async with (  # SDKs refuse to send a lone surrogate; its JSON escape is valid JSON
        aiohttp.ClientSession() as raw,
        raw.post(f"{client.base_url}responses", data=json.dumps(body).encode()) as sent,
    ):
        assert sent.status == 400
        err = (await sent.json())["error"]
    assert (err["type"], err["code"], err["param"]) == (
        "invalid_request_error",
        "invalid_unicode",
        "input",
    )
    t2 = await client.responses.create(model=MODEL, input="on", previous_response_id=t1.id)
    assert t2.previous_response_id == t1.id


@pytest.mark.parametrize("text", AWKWARD)
async def test_the_store_keeps_any_json_string(pg: str, text: str) -> None:
    now = float(int(time.time()))  # whole seconds survive the timestamp column exactly
    part = {"type": "output_text", "text": text}
    item = {"type": "message", "role": "assistant", "content": [part]}
    rows = [
        StoredResponse(
            f"resp_{i}", "t", MODEL, now, now + 60, prev, ({"x": text},), (item,), {"id": text}
        )
        for i, prev in enumerate([None, "resp_0"])
    ]
    store = PostgresResponseStore(pg)
    try:
        for r in rows:
            await store.put(r)
        assert await store.get("resp_0", now) == rows[0]
        assert await store.chain("resp_1", now, 10) == {r.id: r for r in rows}
    finally:
        await store.close()
