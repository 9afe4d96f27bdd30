"""A service under :func:`services.common.server.serve` with the security settings given, for
the TLS / auth / limits tests: ``TelemetryService`` whose ``QueryWindow`` (read) and
``ReportRecords`` (operator) answer, every other RPC the generated base."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
from tideserve.v1 import telemetry_pb2, telemetry_pb2_grpc

from services.common.security.access import AccessTable
from services.common.server import serve
from services.common.settings import ServiceSettings
from tests.helpers.ports import free_port

SERVICE = "tideserve.v1.TelemetryService"


class FakeTelemetry(telemetry_pb2_grpc.TelemetryServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.reported = 0

    async def QueryWindow(self, request: Any, context: Any) -> Any:
        return telemetry_pb2.QueryWindowResponse()

    async def ReportRecords(self, requests: Any, context: Any) -> Any:
        async for _ in requests:
            self.reported += 1
        return telemetry_pb2.ReportRecordsResponse(accepted=self.reported)


@asynccontextmanager
async def secured(
    settings: dict[str, Any], access: Sequence[AccessTable], servicer: FakeTelemetry | None = None
) -> AsyncIterator[int]:
    """Serve until the block ends; yields the gRPC port."""
    port = free_port()
    conf = ServiceSettings.model_validate(
        {"grpc_port": port, "log_format": "text", "shutdown_grace_s": 0.0, **settings}
    )
    ready, stop = asyncio.Event(), asyncio.Event()
    fake = servicer if servicer is not None else FakeTelemetry()

    def register(server: grpc.aio.Server) -> list[str]:
        telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(fake, server)
        return [SERVICE]

    task = asyncio.create_task(
        serve(conf, "telemetry", register, ready=ready, stop=stop, access=access)
    )
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises the startup error
    try:
        yield port
    finally:
        stop.set()
        await task
