"""``python -m services.telemetry``: the telemetry service process."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.common.server import ServiceHooks, run_service
from services.telemetry.servicer import TelemetryServicer, add_to_server
from services.telemetry.settings import TelemetrySettings

__all__ = ["build", "main"]


def build(settings: TelemetrySettings) -> ServiceHooks:
    """Wire the telemetry servicer (and, later, its cores and consumers) from ``settings``."""
    del settings  # nothing configurable yet

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(TelemetryServicer(), server)]

    return ServiceHooks(register=register)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "telemetry",
        TelemetrySettings,
        build,
        argv,
        description="Tideserve telemetry: per-request records, windows, the performance model and recommendations.",
    )
