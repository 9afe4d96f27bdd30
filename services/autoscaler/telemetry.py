"""Reading telemetry for the planner: the ``TelemetryService`` gRPC client, translated.

:class:`TelemetryReader` is what the loop needs; :class:`GrpcTelemetry` implements it over a
``TelemetryService`` channel (QueryWindow for the deployment's total window, GetPerfModel
per role kind). Translation only; an RPC error propagates (the loop turns it into a
telemetry outage and says so).
"""

from __future__ import annotations

from typing import Protocol

import grpc
from tideserve.v1 import common_pb2, telemetry_pb2, telemetry_pb2_grpc

from services.common.perfcoef import from_pb
from services.common.planner.inputs import ClassView, PerfView, WindowView

__all__ = [
    "GrpcTelemetry",
    "TelemetryReader",
    "TelemetryUnavailable",
    "perf_from_proto",
    "window_from_proto",
]

_KIND = {
    "worker": common_pb2.ROLE_WORKER,
    "prefill": common_pb2.ROLE_PREFILL,
    "decode": common_pb2.ROLE_DECODE,
}


class TelemetryUnavailable(RuntimeError):
    """A telemetry RPC failed; the message is ``<STATUS>: <details>``."""


def _unavailable(exc: grpc.aio.AioRpcError) -> TelemetryUnavailable:
    return TelemetryUnavailable(f"{exc.code().name}: {exc.details() or ''}".rstrip(": "))


class TelemetryReader(Protocol):
    async def window(self, deployment: str, window_s: float) -> WindowView: ...

    async def perf(self, deployment: str, kind: str) -> PerfView | None: ...


def window_from_proto(w: telemetry_pb2.WindowStats) -> WindowView:
    return WindowView(
        requests=int(w.requests),
        rate_rps=w.request_rate_rps,
        input_tokens=w.input_tokens.mean,
        output_tokens=w.output_tokens.mean,
        hit_ratio=w.cache_hit_ratio,
        ttft_ms={50: w.ttft_ms.p50, 90: w.ttft_ms.p90, 99: w.ttft_ms.p99} if w.requests else {},
        tpot_ms={50: w.tpot_ms.p50, 90: w.tpot_ms.p90, 99: w.tpot_ms.p99} if w.requests else {},
        classes=tuple(ClassView(c.slo_class, c.ttft_ms, c.tpot_ms) for c in w.classes),
    )


def perf_from_proto(m: telemetry_pb2.PerfModel) -> PerfView:
    return PerfView(from_pb(m), startup_s=m.startup_s if m.startup_samples > 0 else 0.0)


class GrpcTelemetry:
    """:class:`TelemetryReader` over a ``TelemetryService`` channel, each call bounded."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 2.0) -> None:
        self._stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
        self._timeout = timeout_s

    async def window(self, deployment: str, window_s: float) -> WindowView:
        try:
            resp = await self._stub.QueryWindow(
                telemetry_pb2.QueryWindowRequest(deployment=deployment, window_s=window_s),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as exc:
            raise _unavailable(exc) from None
        return window_from_proto(resp.total)

    async def perf(self, deployment: str, kind: str) -> PerfView | None:
        """The fitted model of ``kind`` (None when telemetry has none: NOT_FOUND)."""
        try:
            resp = await self._stub.GetPerfModel(
                telemetry_pb2.GetPerfModelRequest(deployment=deployment, role=_KIND[kind]),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise _unavailable(exc) from None
        return perf_from_proto(resp.model)
