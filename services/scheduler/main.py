"""``python -m services.scheduler``: the scheduler service process."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.common.server import ServiceHooks, run_service
from services.scheduler.servicer import SchedulerServicer, add_to_server
from services.scheduler.settings import SchedulerSettings

__all__ = ["build", "main"]


def build(settings: SchedulerSettings) -> ServiceHooks:
    """Wire the scheduler servicer (and, later, its cores and consumers) from ``settings``."""
    del settings  # nothing configurable yet

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(SchedulerServicer(), server)]

    return ServiceHooks(register=register)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "scheduler",
        SchedulerSettings,
        build,
        argv,
        description="Tideserve scheduler: request admission, queues, routing decisions and the OpenAI-compatible gateway.",
    )
