"""``grpc.health.v1.Health`` for grpc.aio, served by every service
(:func:`services.common.server.serve`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

__all__ = ["HealthService"]

_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthService:
    """``grpc.health.v1.Health`` for grpc.aio (Check, List, Watch).

    Unknown names get NOT_FOUND from ``Check`` and SERVICE_UNKNOWN from ``Watch``. After
    :meth:`shutdown` every name is NOT_SERVING for good and open ``Watch`` streams end right after
    telling their client, so they do not hold up the server's graceful stop.
    """

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._version = 0
        self._closing = False
        self._changed = asyncio.Condition()

    def status(self, service: str = "") -> int | None:
        return self._status.get(service)

    async def set(self, service: str, status: int) -> None:
        """Set one name's status; ignored after :meth:`shutdown`."""
        async with self._changed:
            if self._closing:
                return
            self._status[service] = status
            self._version += 1
            self._changed.notify_all()

    async def shutdown(self) -> None:
        """Every name NOT_SERVING, permanently; idempotent."""
        async with self._changed:
            self._closing = True
            for name in self._status:
                self._status[name] = _NOT_SERVING
            self._version += 1
            self._changed.notify_all()

    async def Check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def List(self, _request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        response = health_pb2.HealthListResponse()
        for name, status in self._status.items():
            response.statuses[name].status = status
        return response

    async def Watch(
        self, request: Any, _context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        seen = -1
        last: int | None = None
        while True:
            async with self._changed:
                while self._version == seen:
                    await self._changed.wait()
                seen = self._version
                status = self._status.get(request.service, _SERVICE_UNKNOWN)
                closing = self._closing
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            if closing:
                return
