"""Settings of the scheduler service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings

__all__ = ["SchedulerSettings"]


class SchedulerSettings(ServiceSettings):
    """scheduler: gRPC on 50051, metrics on 9101 by default."""

    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(9101, ge=0, le=65535, description="Prometheus /metrics; 0 = off")

    http_port: int = Field(
        8000, ge=0, le=65535, description="OpenAI-compatible HTTP gateway port (0 = off)"
    )
