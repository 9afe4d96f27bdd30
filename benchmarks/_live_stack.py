"""The stack ``autoscaler_live.py`` runs in its event loop, each service as its ``main.build``
wires it (migrations as the runner does them), on embedded Postgres and Redis:

* telemetry: ingest of the gateway's ``{prefix}:requests`` records into Postgres and the
  windows, ``QueryWindow``, the fitted performance model (prior: the engines' profile;
  start-up times from the membership stream);
* the scheduler/gateway: no static engines, following ``{prefix}:membership``, writing a
  ``RequestRecord`` per request;
* the autoscaler: the planner loop reading the telemetry service over gRPC, the seam and the
  reconciler over the ``local`` driver (``tideserve engine`` processes), drain through the
  scheduler's ``Drain``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from services.autoscaler.drivers.settings import DriverSettings, LocalSettings
from services.autoscaler.settings import AutoscalerSettings
from services.common import db
from services.common.planner import PlannerConfig
from services.common.planner.spec import SLOClassSpec
from services.telemetry.main import build as build_telemetry
from services.telemetry.model.settings import ModelSettings
from services.telemetry.settings import TelemetrySettings, TelemetrySLOClass
from tests.helpers.autoscale import autoscaler_service, gateway_settings
from tests.helpers.ports import free_ports
from tests.helpers.scheduler import scheduler_service, serving

__all__ = ["LiveStack", "live_stack"]


@dataclass(frozen=True)
class LiveStack:
    autoscaler: str  # gRPC host:port
    telemetry: str
    gateway: str  # http://127.0.0.1:PORT


def telemetry_settings(
    pg_url: str, redis_url: str, prefix: str, port: int, deployment: str, slo: SLOClassSpec,
    profile: str,
) -> TelemetrySettings:  # fmt: skip
    """1-s buckets (the autoscaler's windows are seconds long in compressed time)."""
    return TelemetrySettings(
        grpc_port=port, metrics_port=0, postgres_url=pg_url, redis_url=redis_url,
        stream_prefix=prefix, replica_id="live", bucket_s=1, memory_s=120, ingest_block_ms=100,
        slo_classes=[TelemetrySLOClass(name=slo.name, percentile=slo.percentile,
                                       ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms)],
        model=ModelSettings(profile=profile, deployments=[deployment], refit_interval_s=2.0,
                            follow_load=False),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def live_stack(
    pg_url: str,
    redis_url: str,
    prefix: str,
    deployment: str,
    state: Path,
    slo: SLOClassSpec,
    planner: PlannerConfig | None,
    drain_timeout_s: float = 30.0,
) -> AsyncIterator[LiveStack]:
    """Telemetry, scheduler and autoscaler (``planner`` None: the planner loop off)."""
    tport, sched_grpc, sched_http, as_port, base = free_ports(5)
    tset = telemetry_settings(pg_url, redis_url, prefix, tport, deployment, slo, "test")
    await asyncio.to_thread(db.migrate, pg_url, "telemetry")
    sched = gateway_settings(
        redis_url, state, prefix, deployment, sched_grpc, sched_http
    ).model_copy(update={"request_records": True, "default_slo_class": slo.name})
    settings = AutoscalerSettings(
        grpc_port=as_port, metrics_port=0, postgres_url=pg_url, redis_url=redis_url,
        stream_prefix=prefix, state_dir=state / "autoscaler", load_poll_s=0.5,
        telemetry_address=f"127.0.0.1:{tport}", planner_enabled=planner is not None,
        hold_record_s=3600, planner=planner or PlannerConfig(),
        managed_deployments=[deployment],
        driver=DriverSettings(
            kind="local", scheduler_addresses=[f"127.0.0.1:{sched_grpc}"], resync_s=0.5,
            retry_base_s=0.2, drain_timeout_s=drain_timeout_s, drain_poll_s=0.05,
            local=LocalSettings(port_min=base, port_max=base + 60, probe_interval_s=0.05,
                                state_dir=str(state / "engines"), stop_grace_s=0.05),
        ),
    )  # fmt: skip
    async with (
        serving(tset, "telemetry", build_telemetry),
        scheduler_service(sched),
        autoscaler_service(settings) as address,
    ):
        yield LiveStack(address, f"127.0.0.1:{tport}", f"http://127.0.0.1:{sched_http}")
