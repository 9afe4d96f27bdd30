"""Settings of the autoscaler service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings

__all__ = ["AutoscalerSettings"]


class AutoscalerSettings(ServiceSettings):
    """autoscaler: gRPC on 50053, metrics on 9103 by default."""

    grpc_port: int = Field(50053, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(9103, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
