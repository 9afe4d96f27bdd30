"""A scripted ``TelemetryService`` for autoscaler tests: our own grpc.aio test double of the
telemetry contract (never services/telemetry)."""

from __future__ import annotations

from typing import Any

import grpc
from tideserve.v1 import telemetry_pb2, telemetry_pb2_grpc


class ScriptedTelemetry(telemetry_pb2_grpc.TelemetryServiceServicer):  # type: ignore[misc]
    """Answers QueryWindow with ``window`` (or UNAVAILABLE when ``down``) and GetPerfModel
    with a fixed model: a 1,000-token prompt prefills in 100 ms; decode 10 ms + 0.5 ms/seq."""

    def __init__(self) -> None:
        self.down = False
        self.window = telemetry_pb2.WindowStats()
        self.queries: list[telemetry_pb2.QueryWindowRequest] = []

    async def QueryWindow(self, request: Any, context: Any) -> Any:
        self.queries.append(request)
        if self.down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "telemetry is down")
        return telemetry_pb2.QueryWindowResponse(total=self.window)

    async def GetPerfModel(self, request: Any, context: Any) -> Any:
        return telemetry_pb2.GetPerfModelResponse(
            model=telemetry_pb2.PerfModel(
                prefill_ms_per_token=0.1,
                decode_base_ms=10.0,
                decode_ms_per_seq=0.5,
                decode_ms_per_ktoken=0.1,
                startup_s=5.0,
                startup_samples=3,
                role=request.role,
            )
        )


def window(rate: float, ttft_p90: float = 300.0) -> telemetry_pb2.WindowStats:
    return telemetry_pb2.WindowStats(
        requests=int(rate * 60),
        request_rate_rps=rate,
        input_tokens=telemetry_pb2.Percentiles(mean=1000),
        output_tokens=telemetry_pb2.Percentiles(mean=100),
        ttft_ms=telemetry_pb2.Percentiles(p50=100, p90=ttft_p90, p99=ttft_p90),
        tpot_ms=telemetry_pb2.Percentiles(p50=10, p90=20, p99=30),
    )
