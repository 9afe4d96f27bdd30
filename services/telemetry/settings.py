"""Settings of the telemetry service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.common.settings import ServiceSettings
from services.telemetry.model.settings import ModelSettings
from services.telemetry.windows.classes import SLOClass

__all__ = ["DEFAULT_TELEMETRY_CLASSES", "TelemetrySLOClass", "TelemetrySettings"]


class TelemetrySLOClass(BaseModel):
    """An SLO class as telemetry judges it: met when ``percentile``% of its requests meet
    both targets (0 = no target)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    percentile: float = Field(default=90.0, gt=0.0, le=100.0)
    ttft_ms: float = Field(default=0.0, ge=0.0)
    tpot_ms: float = Field(default=0.0, ge=0.0)

    def core(self) -> SLOClass:
        return SLOClass(self.name, self.percentile, self.ttft_ms, self.tpot_ms)


# The scheduler's default classes (services/scheduler/slo.py: TTFT 2 s / 10 s / none, no TPOT
# target) judged at p90, the percentile llm-d's predictor and most published SLOs use.
DEFAULT_TELEMETRY_CLASSES: tuple[TelemetrySLOClass, ...] = (
    TelemetrySLOClass(name="interactive", ttft_ms=2_000.0),
    TelemetrySLOClass(name="agent", ttft_ms=10_000.0),
    TelemetrySLOClass(name="batch"),
)


class TelemetrySettings(ServiceSettings):
    """telemetry: gRPC on 50054, metrics on 9104 by default."""

    grpc_port: int = Field(50054, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(9104, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    replica_id: str = Field(
        "",
        description="this replica's id, stable across restarts (its rollup rows and consumer "
        "name); '' = the host name. Replicas must differ.",
    )
    deployments: list[str] = Field(
        default_factory=list,
        description="known deployments (records of others are rejected); [] = any name",
    )
    slo_classes: list[TelemetrySLOClass] = Field(
        default_factory=lambda: list(DEFAULT_TELEMETRY_CLASSES)
    )
    bucket_s: int = Field(60, ge=1, description="window bucket (and rollup) length")
    memory_s: int = Field(900, ge=60, description="recent windows answered from memory")
    max_skew_s: float = Field(60.0, ge=0.0, description="finish times accepted ahead of now")
    retention_s: int = Field(7 * 86_400, ge=3600, description="request records kept")
    rollup_retention_s: int = Field(30 * 86_400, ge=3600, description="rollups kept")
    partition_s: int = Field(86_400, ge=3600, description="one records partition per")
    partitions_ahead: int = Field(2, ge=1, description="partitions created ahead of now")
    maintenance_interval_s: float = Field(300.0, gt=0.0, description="partitions + retention")
    ingest_group: str = Field("telemetry", min_length=1, description="consumer group")
    ingest_batch: int = Field(5000, ge=1, le=50_000, description="records per transaction")
    ingest_block_ms: int = Field(1000, ge=0)
    ingest_claim_idle_ms: int = Field(30_000, ge=0, description="reclaim a dead member's")
    gauge_window_s: float = Field(60.0, gt=0.0, description="window of the Prometheus gauges")
    # the fitted performance model and recommendations (GetPerfModel, GetRecommendation)
    model_enabled: bool = Field(True, description="fit the performance model; off = UNIMPLEMENTED")
    model: ModelSettings = Field(
        default_factory=ModelSettings,  # type: ignore[arg-type]
        description="the fit's prior, sample counts, feeds and recommendation bounds",
    )

    def classes(self) -> dict[str, SLOClass]:
        return {c.name: c.core() for c in self.slo_classes}
