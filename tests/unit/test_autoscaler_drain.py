"""The Drainer against a real scheduler gRPC servicer (in process, two unreachable static
workers) and a fake engine: Drain is called (the endpoint is marked draining), a request the
gateway still holds keeps the instance undrained until the timeout, the engine's own
running/queued requests do too, an instance the scheduler does not know counts as 0 there,
and an unreachable scheduler is never taken for "nothing in flight"."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.autoscaler.drivers.drain import Drainer
from services.common.scheduling.service import GatewayCore
from services.scheduler.grpc.servicer import SchedulerServicer, add_to_server
from tests.helpers.ports import free_port
from tests.helpers.scheduler import two_workers


@pytest.fixture
async def scheduler() -> AsyncIterator[tuple[str, GatewayCore]]:
    core = two_workers()
    server = grpc.aio.server()
    add_to_server(SchedulerServicer(core, deployment="d", block_size=16), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", core
    finally:
        await server.stop(None)


class Engine:
    """``/metrics`` in the SGLang dialect with settable running/queued counts."""

    def __init__(self) -> None:
        self.running = 0
        self.queued = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, _req: web.Request) -> web.Response:
        return web.Response(
            text=f"sglang:num_running_reqs {self.running}\nsglang:num_queue_reqs {self.queued}\n"
        )


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, Engine]]:
    eng = Engine()
    server = TestServer(eng.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), eng
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("instance", "gateway_holds", "engine_running", "engine_queued", "drained", "in_flight"),
    [
        ("w1", 0, 0, 0, True, 0),
        ("w1", 1, 0, 0, False, 1),
        ("w1", 0, 2, 0, False, 2),
        ("w1", 0, 0, 3, False, 3),
        ("unknown", 0, 0, 0, True, 0),
    ],
    ids=["idle", "gateway-holds-one", "engine-running", "engine-queued", "unknown-to-scheduler"],
)
async def test_drain(
    scheduler: tuple[str, GatewayCore],
    engine: tuple[str, Engine],
    instance: str,
    gateway_holds: int,
    engine_running: int,
    engine_queued: int,
    drained: bool,
    in_flight: int,
) -> None:
    address, core = scheduler
    url, eng = engine
    eng.running, eng.queued = engine_running, engine_queued
    for k in range(gateway_holds):
        core.fleet.reserve(f"pick-{k}", ["w1"], {}, now=0.0)
    drainer = Drainer([address], timeout_s=0.3, poll_s=0.05)
    try:
        res = await drainer.drain(instance, url)
    finally:
        await drainer.close()
    assert (res.drained, res.in_flight) == (drained, in_flight)
    assert res.polls >= 1 if drained else res.polls > 1
    if instance == "w1":
        assert core.fleet.view("w1", 0.0).draining  # the Drain RPC reached the scheduler


async def test_unreachable_scheduler_is_not_nothing_in_flight(
    engine: tuple[str, Engine],
) -> None:
    url, _ = engine
    drainer = Drainer([f"127.0.0.1:{free_port()}"], timeout_s=0.3, poll_s=0.05, rpc_timeout_s=0.2)
    try:
        res = await drainer.drain("w1", url)
    finally:
        await drainer.close()
    assert (res.drained, res.in_flight) == (False, -1)
