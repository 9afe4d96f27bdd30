"""Settings of the telemetry service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings

__all__ = ["TelemetrySettings"]


class TelemetrySettings(ServiceSettings):
    """telemetry: gRPC on 50054, metrics on 9104 by default."""

    grpc_port: int = Field(50054, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(9104, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
