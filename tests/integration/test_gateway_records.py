"""Request records: the gateway (in process, records middleware installed) in front of
in-process simulated engines publishes one RequestRecord per request to a real Redis,
and carries the W3C trace id to the engine."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tideserve.v1 import events_pb2

from services.common.scheduling import EndpointSpec, build_core
from services.common.streams import decode_entry
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.scheduler.core.records import parse_traceparent
from services.scheduler.feeds.record_sink import RecordSink
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.records import record_requests
from services.scheduler.http.server import Gateway

Seen = list[dict[str, str]]
TRACE = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
async def stack(
    tmp_path: Path, redis_client: Any
) -> AsyncIterator[Callable[..., Awaitable[tuple[str, RecordSink, Seen]]]]:
    servers: list[TestServer] = []
    sinks: list[RecordSink] = []

    async def make(**engine_kw: Any) -> tuple[str, RecordSink, Seen]:
        seen: Seen = []

        @web.middleware
        async def capture(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.method == "POST":
                seen.append(dict(request.headers))
            return await handler(request)  # type: ignore[no-any-return]

        engine_kw.setdefault("profile", "test")
        engine_kw.setdefault("speedup", 50.0)
        settings = EngineSettings(port=0, state_dir=tmp_path / "e", block_size=16, **engine_kw)
        app = EngineServer(settings).app()
        app.middlewares.append(capture)
        es = TestServer(app, host="127.0.0.1")
        await es.start_server()
        servers.append(es)
        url = str(es.make_url("")).rstrip("/")
        core = build_core([EndpointSpec("e1", url)], perf_profile="test", block_size=16)
        gw = Gateway(core, GatewayOptions(background=False, block_size=16, backoff_ms=1, retries=1))
        sink = RecordSink(redis_client, f"ts:requests:{uuid.uuid4().hex[:6]}", flush_s=0.01)
        sinks.append(sink)
        gw.finished.append(record_requests(sink, deployment="dep"))
        gapp = gw.app()
        gs = TestServer(gapp, host="127.0.0.1")
        await gs.start_server()
        servers.append(gs)
        await gw.poll_load()
        return str(gs.make_url("")).rstrip("/"), sink, seen

    yield make
    for s in sinks:
        await s.stop()
    for srv in servers:
        await srv.close()


async def records(redis_client: Any, sink: RecordSink) -> list[events_pb2.RequestRecord]:
    await sink.flush()
    entries = await redis_client.xrange(sink.stream)
    return [decode_entry(f, events_pb2.RequestRecord) for _, f in entries]


def chat(content: str, **kw: Any) -> dict[str, Any]:
    return {
        "model": "tideserve-sim",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 5,
        **kw,
    }


PROMPT = " ".join(f"w{i}" for i in range(200))


async def test_streamed_and_whole_answers_are_recorded_with_trace_ids(
    stack: Any, redis_client: Any
) -> None:
    url, sink, seen = await stack()
    async with aiohttp.ClientSession() as http:
        headers = {
            "traceparent": f"00-{TRACE}-b7ad6b7169203331-01",
            "X-Tideserve-Tenant": "acme",
            "X-Tideserve-Session": "s1",
        }
        async with http.post(
            url + "/v1/chat/completions", json=chat(PROMPT, stream=True), headers=headers
        ) as r:
            assert r.status == 200
            await r.read()
        async with http.post(url + "/v1/chat/completions", json=chat(PROMPT)) as r:
            assert r.status == 200
            usage = (await r.json())["usage"]
    recs = await records(redis_client, sink)
    assert len(recs) == 2
    s, w = recs
    # streamed, with the client's trace id, tenant and session
    assert s.trace_id == TRACE and s.tenant == "acme" and s.session_id == "s1"
    assert s.model == "tideserve-sim" and s.deployment == "dep" and s.profile == "default"
    assert s.outcome == events_pb2.REQUEST_OUTCOME_OK and s.http_status == 200
    assert s.decode_instance == "e1" and not s.prefill_instance and not s.disaggregated
    assert {p.plugin for p in s.scores} >= {"prefix", "ttft"}
    assert s.completion_tokens == 5 and s.prompt_tokens > 200
    assert s.ttft_ms > 0 and s.tpot_ms > 0 and s.e2e_ms >= s.ttft_ms
    assert s.arrival_ms > 0 and s.finish_ms >= s.arrival_ms
    assert s.predicted_cached_tokens == 0 and s.cached_tokens == 0  # first time seen
    # whole answer: a new trace id, the prefix predicted and actually cached
    assert len(w.trace_id) == 32 and w.trace_id != TRACE and int(w.trace_id, 16)
    assert w.predicted_cached_tokens > 0
    assert w.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert w.completion_tokens == 5 and w.tpot_ms == 0.0
    # the engine got a traceparent with the same trace id and the gateway's span id
    tps = [parse_traceparent(h.get("traceparent")) for h in seen]
    assert [t[0] if t else None for t in tps] == [TRACE, w.trace_id]
    assert tps[0] is not None and tps[0][1] != "b7ad6b7169203331"


@pytest.mark.parametrize(
    ("engine_kw", "body", "status", "outcome", "error_part"),
    [
        ({}, b"{nope", 400, events_pb2.REQUEST_OUTCOME_CLIENT_ERROR, "JSON"),
        ({}, json.dumps(chat("x", model="other")).encode(), 404,
         events_pb2.REQUEST_OUTCOME_CLIENT_ERROR, "model"),
        ({"fail_rate": 1.0}, json.dumps(chat("x")).encode(), 503,  # the only engine failed
         events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR, "upstream"),
        ({"die_after_tokens": 2}, json.dumps(chat("x", stream=True)).encode(), 200,
         events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR, "stream"),
    ],
    ids=["bad-json", "unknown-model", "engine-500", "stream-broke"],
)  # fmt: skip
async def test_failures_are_recorded_with_their_outcome(
    stack: Any,
    redis_client: Any,
    engine_kw: dict[str, Any],
    body: bytes,
    status: int,
    outcome: int,
    error_part: str,
) -> None:
    url, sink, _ = await stack(**engine_kw)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == status
            await r.read()
    (rec,) = await records(redis_client, sink)
    assert rec.http_status == status and rec.outcome == outcome
    assert error_part.lower() in rec.error.lower()
    assert len(rec.trace_id) == 32 and rec.request_id


async def test_sink_drops_when_full_and_keeps_records_while_redis_is_down(
    redis_client: Any,
) -> None:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    sink = RecordSink(redis_client, f"ts:requests:{uuid.uuid4().hex[:6]}", buffer=2)
    assert [sink.offer(events_pb2.RequestRecord(request_id=str(i))) for i in range(3)] == [
        True,
        True,
        False,
    ]
    assert await sink.flush() == 2 and sink.stats["dropped"] == 1
    dead = aioredis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    stream = f"ts:requests:{uuid.uuid4().hex[:6]}"
    down = RecordSink(dead, stream, batch=2)
    for rid in ("a", "b", "c"):
        down.offer(events_pb2.RequestRecord(request_id=rid))
    for _ in range(2):  # the outage lasts: nothing is lost, the order is kept
        with pytest.raises(Exception):  # noqa: B017 (redis raises ConnectionError subclasses)
            await down.flush()
    assert down.stats == down.stats | {"dropped": 0, "errors": 2, "published": 0}
    assert len(down) == 3
    await down.stop()  # never raises
    await dead.aclose()
    # Redis is back (the sink's client now reaches it): the kept records go out in order
    down._producer = RecordSink(redis_client, stream)._producer
    assert await down.flush() == 3
    rows = await redis_client.xrange(stream)
    ids = [events_pb2.RequestRecord.FromString(f[b"p"]).request_id for _, f in rows]
    assert ids == ["a", "b", "c"]
