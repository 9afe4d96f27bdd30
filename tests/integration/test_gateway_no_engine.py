"""The gateway with no engine to serve a request, and every error it answers itself.

No engine that can serve (none registered, all drained or unhealthy): HTTP 503 and gRPC
UNAVAILABLE at once, also for requests already waiting in the queue when the last engine
goes; engines there but busy: 429 / RESOURCE_EXHAUSTED as before; a model nothing serves:
404. The admission queue of these gateways waits an hour, so an answer within the clients'
timeouts is a refusal, never a queue timeout.

Errors aiohttp answers on its own (an unparseable request, an unknown path, a wrong
method), on the gateway's port and its metrics port: JSON in the API's error shape, with
nothing of the request echoed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp.test_utils import TestServer
from tideserve.v1 import scheduler_pb2, scheduler_pb2_grpc

from services.common.admission import ClassSpec, QueueConfig
from services.common.scheduling import CoreLimits, EndpointSpec, build_core
from services.scheduler.grpc.servicer import SchedulerServicer
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from services.scheduler.settings import SchedulerSettings
from services.scheduler.slo import SLOClassConfig
from tests.helpers.engines import EngineFleet
from tests.helpers.ports import free_ports
from tests.helpers.scheduler import scheduler_service, scheduler_stub
from tests.helpers.waits import eventually

HOUR_MS = 3_600_000.0
# Clients give up long before the queue would: an answer is never the queue's timeout.
CLIENT = aiohttp.ClientTimeout(total=60)
ERROR_KEYS = {"message", "type", "param", "code"}


def chat(model: str = "tideserve-sim") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _core(specs: list[EndpointSpec], max_queue_ms: float = HOUR_MS) -> Any:
    """A core whose engines take one request each and whose queue waits ``max_queue_ms``."""
    return build_core(
        specs,
        perf_profile="test",
        block_size=16,
        queue=QueueConfig(classes=(ClassSpec("agent", 20, max_queue_ms=max_queue_ms),)),
        limits=CoreLimits(max_in_flight_per_endpoint=1),
    )


@pytest.fixture
async def engine_url(tmp_path: Path) -> AsyncIterator[str]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    _, url = await fleet.start()
    yield url
    await fleet.close()


GatewayFactory = Callable[..., Awaitable[tuple[Gateway, str]]]


@pytest.fixture
async def gateway() -> AsyncIterator[GatewayFactory]:
    servers: list[TestServer] = []

    async def make(specs: list[EndpointSpec], max_queue_ms: float = HOUR_MS) -> tuple[Gateway, str]:
        gw = Gateway(_core(specs, max_queue_ms), GatewayOptions(background=False, block_size=16))
        server = TestServer(gw.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        await gw.poll_load()  # learns the engines' models
        return gw, str(server.make_url("")).rstrip("/")

    yield make
    for s in servers:
        await s.close()


@pytest.mark.parametrize(
    ("fleet", "model", "status", "etype", "code"),
    [
        ("empty", "tideserve-sim", 503, "service_unavailable", "no_endpoint"),
        ("drained", "tideserve-sim", 503, "service_unavailable", "no_endpoint"),
        ("unhealthy", "tideserve-sim", 503, "service_unavailable", "no_endpoint"),
        ("serving", "no-such-model", 404, "invalid_request_error", "model_not_found"),
        ("busy", "tideserve-sim", 429, "rate_limit_error", "overloaded"),
        ("serving", "tideserve-sim", 200, "", ""),
    ],
    ids=["empty-fleet", "all-drained", "all-unhealthy", "unknown-model", "busy", "served"],
)
async def test_a_request_no_engine_can_serve_is_answered_at_once(
    gateway: GatewayFactory,
    engine_url: str,
    fleet: str,
    model: str,
    status: int,
    etype: str,
    code: str,
) -> None:
    specs = [] if fleet == "empty" else [EndpointSpec("e1", engine_url)]
    # busy: the queue gives up soon, as overload should say (429 + Retry-After)
    gw, url = await gateway(specs, max_queue_ms=200.0 if fleet == "busy" else HOUR_MS)
    f = gw.core.fleet
    if fleet == "drained":
        f.set_draining("e1", True)
    elif fleet == "unhealthy":
        for _ in range(f.unhealthy_after):
            f.probe("e1", False, gw.clock())
    elif fleet == "busy":
        f.reserve("someone-else", ["e1"], {}, gw.clock())  # its one slot is taken
    async with (
        aiohttp.ClientSession(timeout=CLIENT) as http,
        http.post(url + "/v1/chat/completions", json=chat(model)) as r,
    ):
        body = await r.json()
    assert r.status == status, body
    if status == 200:
        return
    assert set(body["error"]) == ERROR_KEYS
    assert (body["error"]["type"], body["error"]["code"]) == (etype, code)
    if status == 503:
        assert body["error"]["message"].startswith("no engine is serving")
    assert ("Retry-After" in r.headers) == (status == 429)


@pytest.mark.parametrize("how", ["removed", "retired", "drained"])
async def test_a_waiting_request_is_answered_when_the_last_engine_leaves(
    gateway: GatewayFactory, engine_url: str, how: str
) -> None:
    gw, url = await gateway([EndpointSpec("e1", engine_url)])
    f = gw.core.fleet
    f.reserve("someone-else", ["e1"], {}, gw.clock())  # busy: the request waits
    async with aiohttp.ClientSession(timeout=CLIENT) as http:
        req = asyncio.create_task(_post(http, url + "/v1/chat/completions", chat()))

        async def queued() -> bool:
            return len(gw.core.queue) == 1

        await eventually(queued)
        if how == "removed":
            f.remove("e1")
        elif how == "retired":
            f.retire("e1")  # someone-else's request is in flight: draining until it ends
        else:
            f.set_draining("e1", True)
        status, body = await req  # the gate's own ticker notices
    assert status == 503, body
    assert body["error"]["code"] == "no_endpoint"
    assert body["error"]["message"].startswith("no engine is serving")
    assert len(gw.core.queue) == 0


async def _post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("fleet", "code"),
    [
        ("empty", grpc.StatusCode.UNAVAILABLE),
        ("drained", grpc.StatusCode.UNAVAILABLE),
        ("busy", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("leaves-while-waiting", grpc.StatusCode.UNAVAILABLE),
    ],
    ids=["empty", "drained", "busy", "leaves-while-waiting"],
)
async def test_pick_codes(fleet: str, code: grpc.StatusCode) -> None:
    core = _core(
        [] if fleet == "empty" else [EndpointSpec("w1", "http://127.0.0.1:1", deployment="d")],
        max_queue_ms=200.0 if fleet == "busy" else HOUR_MS,
    )
    if fleet == "drained":
        core.fleet.set_draining("w1", True)
    elif fleet in ("busy", "leaves-while-waiting"):
        core.fleet.reserve("someone-else", ["w1"], {}, 0.0)
    async with scheduler_stub(SchedulerServicer(core, deployment="d", block_size=16)) as stub:
        call = stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text="a b c"), timeout=60)
        task = asyncio.ensure_future(call)
        if fleet == "leaves-while-waiting":

            async def queued() -> bool:
                return len(core.queue) == 1

            await eventually(queued)
            core.fleet.remove("w1")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await task
    assert info.value.code() == code, info.value.details()
    if code == grpc.StatusCode.UNAVAILABLE:
        assert (info.value.details() or "").startswith("no engine is serving")


# -- errors the HTTP servers answer themselves ---------------------------------------------

MARKER = "Zq7xW"  # in what the client sends; must not come back
BIG = MARKER * 20_000  # 100 kB


@pytest.fixture
async def empty_service(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """The scheduler service from settings with no engine (as ``tideserve up`` without
    engines runs it), its queue waiting an hour."""
    http_port, grpc_port, metrics_port = free_ports(3)
    settings = SchedulerSettings(
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        slo_classes=[SLOClassConfig(name="agent", priority=20, max_queue_ms=HOUR_MS)],
        block_size=16,
        perf_profile="test",
        state_dir=tmp_path,
    )
    async with scheduler_service(settings):
        yield {
            "http": f"http://127.0.0.1:{http_port}",
            "metrics": f"http://127.0.0.1:{metrics_port}",
            "grpc": f"127.0.0.1:{grpc_port}",
            "deployment": settings.deployment,
        }


@pytest.mark.parametrize(
    ("port", "method", "path", "headers", "status", "code"),
    [
        ("http", "POST", "/v1/chat/completions", {}, 503, "no_endpoint"),
        ("http", "POST", "/v1/chat/completions", {"X-Big": BIG}, 400, "line_too_long"),
        ("http", "GET", f"/v1/{MARKER}", {}, 404, "not_found"),
        ("http", "GET", "/v1/chat/completions", {}, 405, "method_not_allowed"),
        ("http", "DELETE", "/v1/models", {}, 405, "method_not_allowed"),
        ("http", "GET", "/" + BIG, {}, 400, "line_too_long"),
        ("metrics", "GET", f"/{MARKER}", {}, 404, "not_found"),
        ("metrics", "POST", "/metrics", {}, 405, "method_not_allowed"),
        ("metrics", "GET", "/metrics", {"X-Big": BIG}, 400, "line_too_long"),
    ],
    ids=[
        "empty-fleet",
        "100kB-header",
        "unknown-path",
        "wrong-method",
        "wrong-method-models",
        "100kB-path",
        "metrics-unknown-path",
        "metrics-wrong-method",
        "metrics-100kB-header",
    ],
)
async def test_every_error_is_json_and_echoes_nothing(
    empty_service: dict[str, Any],
    port: str,
    method: str,
    path: str,
    headers: dict[str, str],
    status: int,
    code: str,
) -> None:
    url = empty_service[port] + path
    async with (
        aiohttp.ClientSession(timeout=CLIENT, max_field_size=200_000) as http,
        http.request(method, url, json=chat(), headers=headers) as r,
    ):
        raw = await r.read()
    assert r.status == status, raw[:300]
    assert r.content_type == "application/json", raw[:300]
    assert MARKER.encode() not in raw and b"tideserve-sim" not in raw
    err = json.loads(raw)["error"]
    assert set(err) == ERROR_KEYS and err["code"] == code, err
    if status == 405:
        assert r.headers["Allow"]


async def test_pick_on_the_empty_service_is_unavailable(empty_service: dict[str, Any]) -> None:
    async with grpc.aio.insecure_channel(empty_service["grpc"]) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Pick(
                scheduler_pb2.PickRequest(
                    deployment=empty_service["deployment"], prompt_text="a b c"
                ),
                timeout=60,
            )
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (info.value.details() or "").startswith("no engine is serving")
