"""``python -m services.scheduler``: the scheduler service process.

One process serves the gRPC ``SchedulerService`` (on ``grpc_port``) and the OpenAI-compatible
HTTP gateway (on ``http_port``; 0 = off) over one shared core, so a decision, its reservation
and its release are the same whichever way it is asked. With ``http_reuse_port`` several
replicas listen on one HTTP address (SO_REUSEPORT); every gateway response names the replica
that answered in ``x-tideserve-replica``. The wiring is :mod:`services.scheduler.compose`
(shared with ``tideserve gateway``).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.common import runtime
from services.common.server import ServiceHooks, run_service
from services.scheduler.access import ACCESS
from services.scheduler.compose import REPLICA_HEADER, Scheduler, build_gateway
from services.scheduler.grpc.servicer import add_to_server
from services.scheduler.settings import SchedulerSettings

__all__ = ["REPLICA_HEADER", "build", "build_gateway", "main"]


def build(settings: SchedulerSettings) -> ServiceHooks:
    """The servicer and the HTTP gateway on one core from ``settings``; one Prometheus
    registry (gateway, integrations, gRPC server metrics) served at the gateway's
    ``/metrics`` and on ``metrics_port``."""
    s = Scheduler(settings)

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(s.servicer, server)]

    async def on_start() -> None:
        http = settings.host, settings.http_port, settings.http_reuse_port
        await s.start(http if settings.http_port else None, settle_heap=True)

    return ServiceHooks(
        register=register,
        on_start=on_start,
        on_stop=s.stop,
        registry=s.registry,
        tracer_provider=s.tracer_provider,
        access=(ACCESS,),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start.
    The event loop is uvloop (the gateway's hot path: less CPU per request)."""
    runtime.use_uvloop()
    return run_service(
        "scheduler",
        SchedulerSettings,
        build,
        argv,
        description="Tideserve scheduler: request admission, queues, routing decisions and the OpenAI-compatible gateway.",
    )
