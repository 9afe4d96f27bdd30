"""Settings of the kvmeta service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from typing import Literal

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
    metadata_http_open: bool = Field(
        False,
        description="no token on the metadata endpoint even with auth.enabled: Mooncake's "
        "Transfer Engine sends none (then let only the engines reach the port)",
    )

    # prefix index
    consumer_name: str = Field("kvmeta-1", min_length=1, description="Redis consumer name")
    checkpoint_interval_s: float = Field(
        10.0, ge=0.0, description="index snapshot to Postgres period; 0 = only at shutdown"
    )
    instance_expiry_s: float = Field(
        0.0, ge=0.0, description="drop instances without events/load snapshots this long; 0 = never"
    )
    max_match_blocks: int = Field(16384, ge=1, description="longest MatchPrefix hash list")
    resync_retry_s: float = Field(
        5.0, gt=0.0, description="ask a still-stale instance again after this (doubling)"
    )
    resync_max_retry_s: float = Field(
        60.0, gt=0.0, description="longest wait between resync requests to one instance"
    )
    resync_check_s: float = Field(1.0, gt=0.0, description="period of the stale-instance check")
    # object master
    lease_s: float = Field(5.0, gt=0.0, description="read lease granted by GetReplicaList")
    put_timeout_s: float = Field(30.0, gt=0.0, description="a PutStart not ended is reclaimed")
    high_watermark: float = Field(0.95, gt=0.0, le=1.0, description="evict above this usage")
    low_watermark: float = Field(0.85, gt=0.0, le=1.0, description="evict down to this usage")
    tenant_quotas: dict[str, int] = Field(
        default_factory=dict, description="bytes (size x replicas) each tenant may hold"
    )
    object_tick_s: float = Field(1.0, gt=0.0, description="reclaim/eviction period")
    # agent sessions
    session_percentile: float = Field(
        0.9, gt=0.0, le=1.0, description="percentile of the predicted tool gap (predicted return)"
    )
    session_idle_timeout_s: float = Field(
        1800.0, gt=0.0, description="a session without a turn this long ends"
    )
    session_ended_retention_s: float = Field(
        300.0, ge=0.0, description="an ended session is forgotten after this"
    )
    max_sessions: int = Field(
        1_000_000, ge=1, description="sessions held (a new one beyond: RESOURCE_EXHAUSTED)"
    )
    tool_time_min_samples: int = Field(
        20, ge=1, description="gaps a tool needs before its own distribution is used"
    )
    session_min_samples: int = Field(
        3, ge=1, description="own gaps a session needs before its history is the fallback"
    )
    session_default_gap_s: float = Field(
        30.0, ge=0.0, description="predicted gap when nothing learned is confident yet"
    )
    session_tick_s: float = Field(1.0, gt=0.0, description="session expiry period")
    # telemetry's tool times as the predictor's priors (services/kvmeta/tool_priors.py)
    telemetry_address: str = Field(
        "",
        description="TelemetryService host:port whose GetToolTimes are the tool-time "
        "predictor's priors until kvmeta's own distributions are confident; '' = off",
    )
    telemetry_timeout_s: float = Field(5.0, gt=0.0, description="per telemetry RPC")
    tool_times_refresh_s: float = Field(
        60.0, gt=0.0, description="period of asking telemetry for its tool times"
    )
    tool_times_deployment: str = Field(
        "default",
        description="the deployment whose tool times are the priors (kvmeta's predictor is "
        "one for all the deployments its sessions name)",
    )
    # retention of idle sessions' KV (services/kvmeta/retention.py)
    retention: Literal["off", "observe", "enforce"] = Field(
        "off",
        description="retention controller: off, observe (plan and count; real engines) or "
        "enforce (tell engines that serve /tideserve/retention what to protect and offload)",
    )
    retention_tick_s: float = Field(1.0, gt=0.0, description="retention controller period")
    retention_budget_share: float = Field(
        0.2, ge=0.0, le=1.0, description="share of an engine's KV idle sessions may hold"
    )
    retention_offload: Literal["pressure", "eager"] = Field(
        "pressure",
        description="idle sessions past the budget: pressure (stay on the GPU as evictable "
        "cache while it has room; the engine evicts them on demand, to the tier when it "
        "offloads on eviction) or eager (offloaded at once)",
    )
    retention_engine_urls: dict[str, str] = Field(
        default_factory=dict,
        description="instance id -> engine base URL; else the instance's endpoint in the "
        "membership events, else http://<id> for a host:port id",
    )
    retention_prefetch: bool = Field(
        True,
        description="the retention controller brings an offloaded idle session's prefix back "
        "to its home engine before its predicted return (enforce: engines with a KV-cache "
        "tier; observe: counted only)",
    )
    retention_rebalance: bool = Field(
        False,
        description="the retention controller moves idle sessions off an engine whose active "
        "sessions' KV is at least half its capacity and 1.5x the fleet's mean, to the engine "
        "with the least (engines with a KV-cache tier; observe: counted only)",
    )
    prefetch_margin_ratio: float = Field(
        0.2, ge=0.0, description="prefetch lead: the modelled fetch time stretched by this"
    )
    prefetch_margin_s: float = Field(
        0.5, ge=0.0, description="prefetch lead: seconds added to the stretched fetch time"
    )
    retention_max_chain_blocks: int = Field(
        16_384, ge=1, description="block hashes of a session's chain held for retention"
    )
    migration_offload_wait_s: float = Field(
        10.0,
        ge=0.0,
        description="MigrateSessions: longest wait for the victim engine to store the blocks "
        "it offloads in the tier before the reply (the instance is removed right after)",
    )
    migration_placement: Literal["kv_spread", "rendezvous"] = Field(
        "kv_spread",
        description="MigrateSessions: where a scaled-in instance's sessions go; kv_spread: the "
        "instance with room whose active sessions hold the least KV, each move counted before "
        "the next; rendezvous: each session's rendezvous home among the instances that stay",
    )
    migration_active_window_s: float = Field(
        300.0,
        gt=0.0,
        description="kv_spread: a session whose last turn ended within this many seconds (or "
        "with a turn in flight, or a predicted return ahead) counts in its home's KV",
    )
    migration_prefetch: bool = Field(
        True,
        description="MigrateSessions: ask each moved session's new home (when it has a KV-cache "
        "tier) to fetch its prefix from the tier at once",
    )
