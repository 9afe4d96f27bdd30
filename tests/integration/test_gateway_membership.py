"""Dynamic membership on real Redis: ``ts:membership`` events add, drain and remove gateway
endpoints; a REMOVED endpoint with a request in flight gets no new requests and the
in-flight one finishes; the autoscaler's ListInstances seeds the fleet, and its
UNIMPLEMENTED answer (today) falls back to the static list with one log line. The scheduler
service wired from settings follows the stream end to end."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc, common_pb2, events_pb2

from services.autoscaler.servicer import AutoscalerServicer
from services.autoscaler.servicer import add_to_server as add_autoscaler
from services.common.scheduling import EndpointSpec, build_core
from services.common.streams import StreamProducer, stream_name
from services.scheduler.feeds.membership import Membership
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from services.scheduler.settings import SchedulerSettings
from tests.helpers.engines import until
from tests.helpers.ports import free_port
from tests.helpers.scheduler import scheduler_service
from tests.integration._engine_proc import engine_process

ME = events_pb2.MembershipEvent
DEP = "dep"


class FakeEngine:
    """A controllable OpenAI-ish upstream: streams one chunk, then waits for ``release``."""

    def __init__(self, hold: bool) -> None:
        self.requests = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        if not hold:
            self.release.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _health(self, _req: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, _req: web.Request) -> web.Response:
        return web.Response(text="sglang:num_running_reqs 0\n")

    async def _chat(self, req: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await req.json()
        chunk = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
        if not body.get("stream"):
            await self.release.wait()
            return web.json_response({"choices": [{"message": {"content": "x"}}]})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(req)
        await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.started.set()
        await self.release.wait()
        await out.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        await out.write_eof()
        return out


def _event(kind: int, iid: str, url: str, state: int = common_pb2.INSTANCE_STATE_READY) -> ME:
    return ME(
        kind=kind,  # type: ignore[arg-type]
        instance=common_pb2.Instance(
            instance_id=iid,
            deployment=DEP,
            role=common_pb2.ROLE_WORKER,
            state=state,  # type: ignore[arg-type]
            endpoint=common_pb2.Endpoint(url=url),
        ),
        reason="test",
    )


def _chat(stream: bool) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}


async def test_removed_endpoint_drains_its_in_flight_request(
    redis: aioredis.Redis, servers: Callable[[web.Application], Any]
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    held, free = FakeEngine(hold=True), FakeEngine(hold=False)
    u_held, u_free = await servers(held.app()), await servers(free.app())
    core = build_core([], perf_profile="test", block_size=16)
    gw = Gateway(core, GatewayOptions(background=False, block_size=16, deployment=DEP))
    url = await servers(gw.app())
    members = Membership(core.fleet, deployment=DEP, redis=redis, prefix=prefix, block_ms=50)
    producer = StreamProducer(redis)
    stream = stream_name(prefix, "membership")
    await producer.publish(stream, _event(ME.KIND_ADDED, "held", u_held))
    await members.start()  # no autoscaler: replays the stream from its start
    try:
        await until(lambda: "held" in core.fleet, "the held engine joined")
        async with aiohttp.ClientSession() as http:
            first = await http.post(url + "/v1/chat/completions", json=_chat(True))
            assert first.status == 200
            await asyncio.wait_for(held.started.wait(), 10)
            assert core.fleet.in_flight("held") == 1
            await producer.publish(stream, _event(ME.KIND_REMOVED, "held", u_held))
            await producer.publish(stream, _event(ME.KIND_ADDED, "free", u_free))
            await until(lambda: "free" in core.fleet, "the free engine joined")
            # retired, not forgotten: no new requests, the in-flight one is still counted
            assert core.fleet.retiring("held") and not core.fleet.view("held", 0.0).eligible
            for _ in range(3):
                async with http.post(url + "/v1/chat/completions", json=_chat(False)) as r:
                    assert r.status == 200
            assert (held.requests, free.requests) == (1, 3)
            held.release.set()
            text = (await first.read()).decode()
            first.release()
        assert text.endswith("data: [DONE]\n\n") and "error" not in text
        await until(lambda: "held" not in core.fleet, "the held engine left")
        assert members.stats["retiring"] == 1 and members.stats["ready"] == 2
        # draining and undraining through STATE_CHANGED
        await producer.publish(
            stream,
            _event(ME.KIND_STATE_CHANGED, "free", u_free, common_pb2.INSTANCE_STATE_DRAINING),
        )
        await until(lambda: core.fleet.view("free", 0.0).draining, "the free engine drains")
        await producer.publish(stream, _event(ME.KIND_STATE_CHANGED, "free", u_free))
        await until(
            lambda: not core.fleet.view("free", 0.0).draining, "the free engine is undrained"
        )
    finally:
        await members.stop()


class _Lister(autoscaler_pb2_grpc.AutoscalerServiceServicer):  # type: ignore[misc]
    def __init__(self, instances: list[common_pb2.Instance]) -> None:
        self.instances = instances
        self.asked: list[str] = []

    async def ListInstances(
        self, request: autoscaler_pb2.ListInstancesRequest, context: Any
    ) -> autoscaler_pb2.ListInstancesResponse:
        self.asked.append(request.deployment)
        return autoscaler_pb2.ListInstancesResponse(instances=self.instances)


async def _grpc_server(servicer: Any, real: bool) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    if real:
        add_autoscaler(servicer, server)
    else:
        autoscaler_pb2_grpc.add_AutoscalerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_seed_from_list_instances_then_follow_from_the_tail(
    redis: aioredis.Redis,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    stream = stream_name(prefix, "membership")
    producer = StreamProducer(redis)
    # history before the seed: must not be replayed over the autoscaler's answer
    await producer.publish(stream, _event(ME.KIND_ADDED, "old", "http://127.0.0.1:1"))
    lister = _Lister([_event(ME.KIND_ADDED, "a1", "http://127.0.0.1:30071").instance])
    server, addr = await _grpc_server(lister, real=False)
    core = build_core([EndpointSpec("s", "http://127.0.0.1:30070")], perf_profile="test")
    async with grpc.aio.insecure_channel(addr) as ch:
        m = Membership(
            core.fleet, deployment=DEP, redis=redis, prefix=prefix, channel=ch, block_ms=50
        )
        await m.start()
        try:
            assert lister.asked == [DEP] and core.fleet.ids() == ["a1", "s"]
            await producer.publish(stream, _event(ME.KIND_ADDED, "new", "http://127.0.0.1:2"))
            await until(lambda: "new" in core.fleet, "the new engine joined")
            assert "old" not in core.fleet and m.stats["seeded"] == 1
        finally:
            await m.stop()
    await server.stop(None)


async def test_unimplemented_autoscaler_falls_back_to_the_static_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # an autoscaler without ListInstances (the generated base class answers UNIMPLEMENTED)
    server, addr = await _grpc_server(autoscaler_pb2_grpc.AutoscalerServiceServicer(), real=False)
    core = build_core([EndpointSpec("s", "http://127.0.0.1:30070")], perf_profile="test")
    caplog.set_level(logging.WARNING, logger="services.scheduler.feeds.membership")
    async with grpc.aio.insecure_channel(addr) as ch:
        m = Membership(core.fleet, deployment=DEP, channel=ch, autoscaler=addr)
        await m.start()  # no Redis: seed only
        await m.stop()
    await server.stop(None)
    assert core.fleet.ids() == ["s"] and m.stats["seed_failed"] == 1
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("services.scheduler")]
    assert len(lines) == 1 and "UNIMPLEMENTED" in lines[0] and "static endpoint list" in lines[0]
    assert "\n" not in lines[0]


async def test_service_follows_membership_and_load_snapshots(
    redis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """The scheduler service from settings: the autoscaler has no Postgres (ListInstances
    fails), there is no static endpoint, a simulated engine is ADDED on the stream and publishes its load
    snapshots; requests are served through it and /metrics shows where load came from."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    # the real autoscaler without Postgres: ListInstances answers FAILED_PRECONDITION
    auto, auto_addr = await _grpc_server(AutoscalerServicer(None, lambda: 0), real=True)
    eng_args = ["--instance-id", "eng-1", "--redis-url", redis_url]
    eng_args += ["--deployment", DEP, "--stream-prefix", prefix]
    try:
        async with engine_process(tmp_path / "e", *eng_args) as eng_url:
            await _service_follows(redis, redis_url, prefix, auto_addr, eng_url, tmp_path)
    finally:
        await auto.stop(None)


async def _service_follows(
    redis: aioredis.Redis,
    redis_url: str,
    prefix: str,
    auto_addr: str,
    eng_url: str,
    tmp_path: Path,
) -> None:
    http_port = free_port()
    settings = SchedulerSettings(
        grpc_port=0,
        http_port=http_port,
        metrics_port=0,
        deployment=DEP,
        redis_url=redis_url,
        stream_prefix=prefix,
        request_records=False,
        autoscaler_address=auto_addr,
        models=["tideserve-sim"],
        perf_profile="test",
        block_size=16,
        state_dir=tmp_path,
    )
    base = f"http://127.0.0.1:{http_port}"
    async with scheduler_service(settings):
        await StreamProducer(redis).publish(
            stream_name(prefix, "membership"), _event(ME.KIND_ADDED, "eng-1", eng_url)
        )
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            text = ""
            for _ in range(200):
                async with http.get(base + "/metrics") as r:
                    text = await r.text()
                if (
                    'tideserve_gateway_endpoint_load_source{instance="eng-1",source="stream"} 1.0'
                    in text
                ):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("no load snapshot applied:\n" + text)
            body = {**_chat(False), "model": "tideserve-sim", "max_tokens": 3}
            async with http.post(base + "/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
            async with http.get(base + "/metrics") as r:
                text = await r.text()
        assert 'tideserve_gateway_feed_total{event="seed_failed",feed="membership"} 1.0' in text
        assert 'tideserve_gateway_feed_total{event="ready",feed="membership"} 1.0' in text
        assert 'tideserve_gateway_requests_total{outcome="ok"' in text
