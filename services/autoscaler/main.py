"""``python -m services.autoscaler``: the autoscaler service process."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.autoscaler.servicer import AutoscalerServicer, add_to_server
from services.autoscaler.settings import AutoscalerSettings
from services.common.server import ServiceHooks, run_service

__all__ = ["build", "main"]


def build(settings: AutoscalerSettings) -> ServiceHooks:
    """Wire the autoscaler servicer (and, later, its cores and consumers) from ``settings``."""
    del settings  # nothing configurable yet

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(AutoscalerServicer(), server)]

    return ServiceHooks(register=register)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "autoscaler",
        AutoscalerSettings,
        build,
        argv,
        description="Tideserve autoscaler: deployments, instances and scaling decisions.",
    )
