"""Settings of the kvmeta service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings

__all__ = ["KVMetaSettings"]


class KVMetaSettings(ServiceSettings):
    """kvmeta: gRPC on 50052, metrics on 9102 by default."""

    grpc_port: int = Field(50052, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(9102, ge=0, le=65535, description="Prometheus /metrics; 0 = off")

    metadata_http_port: int = Field(
        8081, ge=0, le=65535, description="Mooncake Transfer Engine HTTP metadata port (0 = off)"
    )
