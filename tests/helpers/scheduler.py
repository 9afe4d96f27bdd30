"""The scheduler in a test's event loop: its gRPC servicer alone on a free port, or the
whole service (``services.scheduler.main.build`` + ``serve``) from settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
from tideserve.v1 import scheduler_pb2_grpc

from services.common.scheduling import EndpointSpec, build_core
from services.common.scheduling.service import GatewayCore
from services.common.server import ServiceHooks, serve
from services.scheduler.grpc.servicer import SchedulerServicer, add_to_server
from services.scheduler.main import build
from services.scheduler.settings import SchedulerSettings


def two_workers(deployment: str = "d") -> GatewayCore:
    """A core over two unreachable static workers ``w1``/``w2`` (test perf profile, 16-token
    blocks): enough for decisions that are never forwarded."""
    return build_core(
        [
            EndpointSpec("w1", "http://127.0.0.1:1", deployment=deployment),
            EndpointSpec("w2", "http://127.0.0.1:2", deployment=deployment),
        ],
        perf_profile="test",
        block_size=16,
    )


@asynccontextmanager
async def scheduler_stub(servicer: SchedulerServicer) -> AsyncIterator[Any]:
    """A ``SchedulerServiceStub`` talking to ``servicer`` on a free 127.0.0.1 port."""
    server = grpc.aio.server()
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield scheduler_pb2_grpc.SchedulerServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


@asynccontextmanager
async def serving(
    settings: Any, name: str, build_hooks: Callable[[Any], ServiceHooks]
) -> AsyncIterator[None]:
    """Service ``name`` from ``build_hooks(settings)`` (a ``main.build``) serving until the
    block ends (then a graceful stop)."""
    hooks = build_hooks(settings)
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve(
            settings,
            name,
            hooks.register,
            on_start=hooks.on_start,
            on_stop=hooks.on_stop,
            ready=ready,
            stop=stop,
            registry=hooks.registry,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


@asynccontextmanager
async def scheduler_service(settings: SchedulerSettings) -> AsyncIterator[None]:
    """The scheduler service serving until the block ends (then a graceful stop)."""
    async with serving(settings, "scheduler", build):
        yield
