"""Settings of the KV-event bridge (``kv_bridge`` section of ``tideserve.yaml``)."""

from __future__ import annotations

from pydantic import Field, field_validator

from services.common.settings import ServiceSettings
from services.kvbridge.wire import Engine

__all__ = ["KVBridgeSettings"]


class KVBridgeSettings(ServiceSettings):
    """One bridge process subscribes to one engine publisher (one Tideserve instance).

    ``redis_url`` (common setting) is required: events go to ``{stream_prefix}:kv:{deployment}``.
    """

    engine: Engine = Field(Engine.VLLM, description="wire dialect: vllm or sglang")
    endpoint: str = Field(
        "tcp://127.0.0.1:5557", min_length=1, description="the engine's ZMQ PUB endpoint"
    )
    replay_endpoint: str | None = Field(
        None, description="the engine's ZMQ ROUTER replay endpoint (gaps are then replayed)"
    )
    topic: str = Field("", description="ZMQ topic the engine publishes on (prefix match)")
    deployment: str = Field("default", min_length=1, description="deployment of the instance")
    instance_id: str = Field("", description="instance id in events (default: the endpoint)")
    tenant: str = Field("", description="tenant namespace stamped on every event")
    kv_group: int = Field(0, ge=-1, description="vLLM KV cache group to index; -1 = all")
    block_size: int = Field(0, ge=0, description="block size announced when events carry none")
    replay_timeout_s: float = Field(2.0, gt=0.0, description="silence that ends a replay")
    stream_maxlen: int = Field(100_000, ge=1, description="approximate MAXLEN of the stream")
    redis_url_env: str = Field(
        "",
        description="environment variable holding the Redis URL (wins over redis_url; a "
        "sidecar beside an engine reads the engine's, TIDESERVE_ENGINE_REDIS_URL)",
    )

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value:
            raise ValueError("expected a ZMQ endpoint such as tcp://host:5557")
        return value

    @property
    def effective_instance_id(self) -> str:
        """``instance_id``, or the endpoint when none is set."""
        return self.instance_id or self.endpoint
