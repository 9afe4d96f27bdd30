"""Settings of one simulated engine instance (built in ``cli.main`` from flags, passed down).

Environment: ``TIDESERVE_ENGINE_<FIELD>`` (e.g. ``TIDESERVE_ENGINE_SPEEDUP=10``); command-line
flags override it. Nothing is read at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from services.common.redis_client import RedisClientOptions
from services.common.security.settings import TlsSettings
from services.common.settings import TracingSettings
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE

__all__ = ["EngineSettings"]


class EngineSettings(TracingSettings):
    """Tracing (``trace_exporter``, ``otlp_*``; environment only, e.g.
    ``TIDESERVE_ENGINE_TRACE_EXPORTER=otlp``): with an exporter, each API request is a SERVER
    span continuing the caller's ``traceparent`` (the gateway's upstream call)."""

    model_config = SettingsConfigDict(env_prefix="TIDESERVE_ENGINE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(30001, ge=0, le=65535, description="HTTP API port; 0 picks a free one")
    instance_id: str = ""
    role: Literal["aggregated", "prefill", "decode", "kvcache"] = Field(
        "aggregated", description="kvcache: hold a DRAM segment of the KV-cache tier, no model"
    )
    profile: str = "h200-llama3.1-8b"
    model: str = "tideserve-sim"
    model_path: Path | None = Field(
        None,
        description="model directory (tokenizer.json, tokenizer_config.json): tokenize prompts "
        "with its tokenizer and chat template; None = the whitespace tokenizer",
    )
    redis_client: RedisClientOptions = Field(
        default_factory=RedisClientOptions,
        description="timeouts, health checks and retries of the Redis client",
    )
    kv_blocks: int = Field(0, ge=0, description="KV capacity in blocks; 0 = what fits the profile")
    kv_running_blocks: int = Field(
        0, ge=0, description="blocks running requests may hold at most; 0 = all of the KV"
    )
    block_size: int = Field(
        DEFAULT_BLOCK_SIZE, ge=1, description="tokens per KV block (divides 512)"
    )
    max_batch: int = Field(256, ge=1, description="max running sequences")
    max_batched_tokens: int = Field(8192, ge=1, description="token budget per step")
    speedup: float = Field(1.0, gt=0.0, description="modelled time runs this much faster")
    stream_interval: int = Field(1, ge=1, description="tokens per streamed chunk")
    default_max_tokens: int = Field(128, ge=1)
    redis_url: str | None = None
    deployment: str = "default"
    stream_prefix: str = "ts"
    kv_flush_ms: float = Field(50.0, gt=0.0)
    load_interval_ms: float = Field(250.0, gt=0.0)
    resync_max_blocks: int = Field(
        4096, ge=1, description="blocks per batch when answering a resync request in chunks"
    )
    metrics_dialect: Literal["sglang", "vllm"] = "sglang"
    bootstrap_port: int = Field(0, ge=0, le=65535, description="prefill: rendezvous port; 0 = none")
    bootstrap_timeout_s: float = Field(60.0, gt=0.0)
    hold_timeout_s: float = Field(30.0, gt=0.0, description="prefill frees unclaimed KV after")
    decode_keeps_kv: bool = Field(
        False,
        description="decode: cache the KV a prefill peer hands off and take only the prompt "
        "part not resident (the modelled hand-off)",
    )
    short_first_tokens: int = Field(
        0, ge=0, description="prefill prompts with at most N tokens left first; 0 = FCFS"
    )
    # Real KV bytes over the Transfer Engine (services/common/dataplane).
    kv_data_plane: bool = Field(
        False, description="hold real KV bytes and move them over Mooncake's Transfer Engine"
    )
    te_metadata_url: str = Field(
        "http://127.0.0.1:8081/metadata", description="kvmeta's Mooncake metadata endpoint"
    )
    te_protocol: Literal["tcp", "rdma"] = "tcp"
    te_device: str = Field("", description="rdma: NIC names (mlx5_0,...); empty = discover")
    te_hostname: str = Field(
        "", description="segment name host:port; empty = host:<HTTP port> (or a free port)"
    )
    kv_bytes_scale: int = Field(
        256, ge=1, description="a block holds profile KV bytes/token x block_size / this"
    )
    kv_staging_blocks: int = Field(
        0, ge=0, description="arena slots receiving pulled blocks; 0 = the cache's capacity"
    )
    kv_transfer_timeout_s: float = Field(10.0, gt=0.0, description="a pull slower fails")
    kvmeta_address: str = Field("127.0.0.1:50052", description="kvcache role: kvmeta's gRPC")
    kvmeta_token_file: Path | None = Field(
        None, description="the token (operator) sent to kvmeta when its auth is on"
    )
    kvmeta_tls: TlsSettings = Field(
        default_factory=TlsSettings,  # type: ignore[arg-type]
        description="TLS toward kvmeta (ca_file verifies it; cert/key for mutual TLS)",
    )
    kvcache_tier: bool = Field(
        False,
        description="write cached blocks through to the KV-cache tier (kvmeta at "
        "kvmeta_address) and fetch prefixes from it instead of recomputing; implies "
        "kv_data_plane",
    )
    kvcache_policy: Literal["write_through", "offload_on_evict"] = Field(
        "write_through",
        description="with kvcache_tier: store every computed block (write_through) or only "
        "the blocks the engine evicts (offload_on_evict)",
    )
    kvcache_disk_url: str | None = Field(
        None,
        description="with kvcache_tier: store blocks on the disk segment of the kvcache "
        "instance at this URL (durable across its restarts) instead of in a DRAM segment",
    )
    kvcache_mib: int = Field(1024, ge=1, description="kvcache role: DRAM segment size (MiB)")
    kvcache_disk_mib: int = Field(
        0, ge=0, description="kvcache role: disk segment size (MiB); 0 = no disk segment"
    )
    kvcache_disk_dir: Path | None = Field(
        None,
        description="kvcache role: the disk segment's files (blocks, index log, snapshot); "
        "default <state_dir>/kvcache-disk; one instance per directory",
    )
    kvcache_disk_compact_records: int = Field(
        4096, ge=1, description="kvcache role: snapshot the disk index after this many log records"
    )
    state_dir: Path = Field(default_factory=lambda: Path.home() / ".local/share/tideserve")
    # Fault knobs.
    fail_rate: float = Field(0.0, ge=0.0, le=1.0, description="fraction of requests answered 500")
    die_after_tokens: int = Field(0, ge=0, description="close streams abruptly after N tokens")
    refuse_health: bool = False
    seed: int = 0
    catch_up_ms: float = Field(
        200.0,
        ge=0.0,
        description="keep the modelled step schedule when the shell is at most this many wall "
        "ms behind it (its own overhead); 0 = every step starts at the wall clock",
    )
    step_trace: Path | None = Field(
        None, description="diagnostic: write each step and request as JSON lines here"
    )
    log_level: str = "INFO"

    @field_validator("redis_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("state_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()
