"""Settings of the autoscaler service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from pydantic import Field

from services.autoscaler.drivers.settings import DriverSettings
from services.common.planner.config import PlannerConfig
from services.common.settings import ServiceSettings

__all__ = ["AutoscalerSettings"]


class AutoscalerSettings(ServiceSettings):
    """autoscaler: gRPC on 50053, metrics on 9103 by default. Deployments, revisions and
    decisions need ``postgres_url``; without it every deployment RPC answers
    FAILED_PRECONDITION and the planner loop does not run. ``driver`` says what carries out
    the decisions (``TIDESERVE_AUTOSCALER__DRIVER__KIND=local``); membership events go to
    ``{stream_prefix}:membership`` on ``redis_url`` (none without it)."""

    grpc_port: int = Field(50053, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(9103, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    telemetry_address: str = Field(
        "127.0.0.1:50054", min_length=1, description="TelemetryService host:port"
    )
    telemetry_timeout_s: float = Field(2.0, gt=0, description="per telemetry RPC")
    planner: PlannerConfig = Field(default_factory=PlannerConfig, description="SLA planner")
    planner_enabled: bool = Field(True, description="run the planner loop (else RPCs only)")
    advisory: bool = Field(
        False, description="dry-run: decide and record, never hand targets to the reconciler"
    )
    managed_deployments: list[str] = Field(
        default_factory=list,
        description="deployments this autoscaler plans, starts and resumes: names or "
        "shell-style patterns (chat-*); [] = every stored deployment (see scope.py)",
    )
    budget_groups: dict[str, int] = Field(
        default_factory=dict,
        description="shared replica budgets for tidal co-location: group -> replicas",
    )
    hold_record_s: float = Field(
        300.0, ge=0, description="store a decision that changes nothing at most this often"
    )
    driver: DriverSettings = Field(
        default_factory=DriverSettings,  # type: ignore[arg-type]
        description="driver (local, kubernetes, dry-run), drain and reconciler retries",
    )
    load_poll_s: float = Field(
        1.0, gt=0, description="how often each ready instance's /metrics load is scraped"
    )
    session_kv_poll_s: float = Field(
        10.0,
        gt=0,
        description="how often kvmeta is asked for each instance's agent-session KV "
        "(victim cost; with driver.kvmeta_address)",
    )
