"""Settings of the scheduler service (common keys in :class:`ServiceSettings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from services.common.admission.shaper_config import (
    DISPATCH_FOLLOW_MS,
    DISPATCH_HOLD_MS,
    DISPATCH_ORDER,
    DISPATCH_PROTECT_WHEN_MISSED,
)
from services.common.settings import ServiceSettings
from services.common.tokens import HashScheme
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE
from services.scheduler.slo import DEFAULT_SLO_CLASSES, SLOClassConfig, queue_config

__all__ = ["SchedulerSettings", "parse_endpoint", "split_bootstrap"]


class SchedulerSettings(ServiceSettings):
    """scheduler: gRPC on 50051, metrics on 9101 by default."""

    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free port")
    metrics_port: int = Field(9101, ge=0, le=65535, description="Prometheus /metrics; 0 = off")

    http_port: int = Field(
        8000, ge=0, le=65535, description="OpenAI-compatible HTTP gateway port (0 = off)"
    )
    http_reuse_port: bool = Field(
        False,
        description="listen on http_port with SO_REUSEPORT so several gateway replicas share "
        "one address (Linux: the kernel spreads new connections over the live replicas)",
    )

    # --- gateway / routing (owned by the scheduler helper) -------------------------------
    deployment: str = Field("default", min_length=1, description="deployment this serves")
    endpoints: list[str] = Field(
        default_factory=list,
        description="static engines: URL or ROLE=URL (ROLE worker, prefill or decode); a "
        "prefill engine's SGLang bootstrap port as a suffix: prefill=URL#bootstrap=PORT",
    )
    models: list[str] = Field(
        default_factory=list, description="model names accepted; empty = ask the engines"
    )
    profiles_file: Path | None = Field(
        None, description="scheduler profiles YAML; None = the shipped default_profiles.yaml"
    )
    profile: str = Field(
        "", description="scheduler profile of requests that name none; '' = the config's default"
    )
    block_size: int = Field(
        DEFAULT_BLOCK_SIZE, ge=1, description="tokens per KV block for prefix hashing"
    )
    model_path: Path | None = Field(
        None,
        description="model directory (tokenizer.json, tokenizer_config.json with its chat "
        "template): tokenize as the served model does; None = the simulator's whitespace "
        "tokenizer",
    )
    hash_scheme: HashScheme = Field(
        "tideserve",
        description="block hashes as this engine kind computes them: tideserve (the engine "
        "simulator), vllm or sglang (equal to their KV events; needs model_path)",
    )
    perf_profile: str = Field("", description="perfmodel profile for ttft-cost; '' = default")
    seed: int = Field(0, description="seed of the routing RNG (random ties, power-of-two)")
    retries: int = Field(2, ge=0, le=10, description="upstream retries before the first byte")
    pd_protocol: Literal["sglang", "vllm"] = Field(
        "sglang",
        description="P/D hand-off of this deployment's engines: sglang (bootstrap host/port/"
        "room, prefill and decode at once) or vllm (prefill max_tokens=1, then decode with "
        "its kv_transfer_params)",
    )
    decode_can_prefill: bool | None = Field(
        None,
        description="whether decode instances can compute a prompt without a prefill peer; "
        "None = from pd_protocol (sglang: false, its decode servers need a prefill peer; "
        "vllm: true). False: every request on a decode instance is disaggregated",
    )
    preemption: bool = Field(
        True, description="pre-empt lower classes before their first byte for higher ones"
    )
    dispatch_hold_ms: float = Field(
        DISPATCH_HOLD_MS,
        ge=0,
        description="dispatch order: hold picks for an instance while the predicted prefill "
        "this gateway sent there and has no first byte of is at least this many ms, and let "
        "them go in dispatch_order, higher SLO classes first "
        "(services.common.admission.shaper); 0 = send every pick at once",
    )
    dispatch_order: Literal["shortest", "slo"] = Field(
        DISPATCH_ORDER,
        description="dispatch order: shortest predicted prefill first, or slo (requests "
        "that can still meet their class's TTFT target first, by latest start)",
    )
    dispatch_age_weight: float = Field(
        1.0, ge=0, description="dispatch order: ms of predicted prefill forgiven per ms waited"
    )
    dispatch_follow_ms: float = Field(
        DISPATCH_FOLLOW_MS,
        ge=0,
        description="dispatch order: hold a pick whose prefix an earlier pick without a first "
        "byte is still computing on the same instance until that first byte, at most this "
        "many ms, so that it finds the prefix cached (services.common.admission.follow); "
        "0 = off",
    )
    dispatch_protect: Literal["off", "guard", "slack", "auto"] = Field(
        "off",
        description="dispatch order: while an engine serves a request that can still meet its "
        "TTFT target (until its first byte), hold other prompts for it, each at most its "
        "class's starve_after_ms (services.common.admission.protect); guard: every prompt "
        "but the smallest, slack: those longer than the guards' predicted slack; auto: guard "
        "only while the fleet is overloaded (dispatch_protect_when_missed); off",
    )
    dispatch_protect_when_missed: float = Field(
        DISPATCH_PROTECT_WHEN_MISSED,
        gt=0,
        le=1,
        description="dispatch_protect auto: protect while at least this share of the recent "
        "requests with a TTFT target were predicted, when offered to the dispatch order, to "
        "miss it (their engine's predicted backlog plus their own prefill and first-chunk lag)",
    )
    forward_authorization: bool = Field(
        False, description="pass the client's Authorization header on to the engines"
    )
    engine_api_key: SecretStr = Field(
        SecretStr(""),
        description="sent to the engines as 'Authorization: Bearer KEY' (engines started "
        "with --api-key); overrides forward_authorization; '' = none",
    )
    health_interval_s: float = Field(1.0, gt=0, description="active health probe period")
    load_interval_s: float = Field(0.5, gt=0, description="engine /metrics scrape period")
    max_in_flight_per_endpoint: int = Field(256, ge=1, description="dispatch bound per engine")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="larger bodies get 413")
    max_prompt_tokens: int = Field(
        1_000_000, ge=1, description="longer prompts (in tokens) get 413 prompt_too_long"
    )
    max_output_tokens: int = Field(
        131_072, ge=1, description="largest max_tokens a request may ask for (else 400)"
    )
    max_messages: int = Field(10_000, ge=1, description="chat messages per request (else 400)")
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="request headers, names + values (else 431)"
    )

    # --- client APIs (services/scheduler/http/messages.py, responses.py) -------------------
    native_apis: list[Literal["messages", "responses"]] = Field(
        default_factory=list,
        description="client APIs besides OpenAI chat/completions this deployment's engines "
        "serve themselves (vLLM serves /v1/messages and /v1/responses): forwarded in that "
        "API; the others are forwarded as chat completions and their answers translated back",
    )
    responses_retention_s: float = Field(
        30 * 86400.0,
        gt=0,
        description="stored responses (Responses API, store: true; in postgres_url) are "
        "kept this long, then never served and swept; no postgres_url = nothing stored",
    )

    # --- API keys and rate limits (services/scheduler/keys) -------------------------------
    api_keys: bool = Field(
        False,
        description="require an API key (Authorization: Bearer sk-ts-...) on the OpenAI "
        "routes; tenant and SLO classes come from the key (tideserve keys create); needs "
        "postgres_url; rate limits are shared through redis_url (else per replica)",
    )
    api_key_cache_ttl_s: float = Field(
        5.0, gt=0, description="a key is re-read from Postgres after this: revocation delay"
    )
    api_key_stale_s: float = Field(
        300.0, gt=0, description="while Postgres fails, keys seen this recently still work"
    )
    rate_limit_window_s: float = Field(
        60.0, gt=0, description="rate-limit window; a key's rpm/tpm are per window"
    )
    rate_limit_lease_fraction: float = Field(
        0.02,
        ge=0,
        le=0.5,
        description="share of a tenant's limit a replica reserves in Redis at once and admits "
        "from locally (one round trip per lease, not per request); 0 = a round trip per request",
    )
    rate_limit_redis_timeout_s: float = Field(
        0.25, gt=0, description="Redis socket timeout of the rate-limit counters"
    )

    # --- integrations (owner: gateway integrations; see gateway/integrations.py) ---------
    kvmeta_address: str = Field("", description="kvmeta gRPC host:port for MatchPrefix; '' = off")
    kvmeta_deadline_ms: float = Field(20.0, gt=0, description="MatchPrefix deadline")
    precise_source: Literal["kvmeta", "local", "off"] = Field(
        "kvmeta",
        description="precise-prefix data: kvmeta (MatchPrefix per request, needs "
        "kvmeta_address), local (a replica of the KV index in this process, fed from "
        "{prefix}:kv:{deployment}; needs redis_url) or off",
    )
    agent_sessions: bool = Field(
        False,
        description="tell kvmeta (kvmeta_address) as agent-session turns start and end, off the "
        "request path (retention and prefetch of idle sessions' KV read them)",
    )
    agent_sessions_buffer: int = Field(
        10_000, ge=1, description="session turn calls queued for kvmeta at most; more are dropped"
    )
    agent_sessions_deadline_ms: float = Field(
        1000.0, gt=0, description="deadline of one session turn call to kvmeta"
    )
    replica_id: str = Field("", description="this gateway replica's id; '' = host-pid-random")
    share_state: bool = Field(
        False, description="active-active: share routed prefixes + in-flight load via redis_url"
    )
    # 0.1 s: the dispatch orders' backlogs are read fresh enough that replicas do not both
    # fill an engine's queue (benchmarks/README.md, "Several gateway replicas, simulator")
    share_heartbeat_s: float = Field(0.1, gt=0, description="in-flight heartbeat period")
    share_heartbeat_ttl_s: float = Field(3.0, gt=0, description="a replica's load expires after")
    request_records: bool = Field(True, description="RequestRecord per request (needs redis_url)")
    record_tool_contents: bool = Field(
        False,
        description="agent tool calls on record and on spans with their contents (tool-result "
        "text, call arguments), not only names and sizes; off: contents never leave the gateway",
    )

    # --- SLO classes, tenants, queue bounds (see services/scheduler/slo.py) --------------
    slo_classes: list[SLOClassConfig] = Field(
        default_factory=lambda: list(DEFAULT_SLO_CLASSES),
        description="SLO classes: name, priority, ttft_ms, tpot_ms, max_queue_ms, ...",
    )
    default_slo_class: str = Field("agent", min_length=1, description="class of unnamed requests")
    tenants: dict[str, float] = Field(
        default_factory=dict, description="tenant -> fair-share weight; {} = any tenant, weight 1"
    )
    queue_max_total: int = Field(50_000, ge=1, description="queued requests across classes")

    # --- fleet feeds: load snapshots and membership (gateway/load_stream, membership) ----
    load_stream: bool = Field(True, description="consume {prefix}:load:{deployment} (redis_url)")
    load_stream_stale_s: float = Field(
        2.0, gt=0, description="a snapshot older than this falls back to /metrics scraping"
    )
    scrape_queue_estimate: bool = Field(
        False,
        description="scraped load: price the waiting requests this gateway did not send "
        "(at the mean prefill of its picks) as queued prefill",
    )
    membership_stream: bool = Field(True, description="consume {prefix}:membership (redis_url)")
    autoscaler_address: str = Field(
        "", description="autoscaler gRPC host:port; ListInstances seeds the fleet once; '' = off"
    )
    autoscaler_deadline_s: float = Field(3.0, gt=0, description="ListInstances deadline")
    telemetry_address: str = Field(
        "",
        description="telemetry gRPC host:port: price predicted TTFT with its fitted model; '' = off",
    )
    perf_model_refresh_s: float = Field(10.0, gt=0, description="GetPerfModel period")
    perf_model_min_confidence: float = Field(
        0.5,
        ge=0,
        le=1,
        description="fitted prefill confidence from which the fit replaces the profile",
    )

    def decode_computes_prompts(self) -> bool:
        """``decode_can_prefill``, or its default for ``pd_protocol``."""
        if self.decode_can_prefill is not None:
            return self.decode_can_prefill
        return self.pd_protocol == "vllm"

    @model_validator(mode="after")
    def _check_slo(self) -> SchedulerSettings:
        try:
            queue_config(
                self.slo_classes,
                default_class=self.default_slo_class,
                tenants=self.tenants,
                max_total=self.queue_max_total,
            )
        except ValueError as e:
            raise ValueError(f"slo_classes/tenants: {e}") from None
        return self

    @field_validator("endpoints")
    @classmethod
    def _check_endpoints(cls, value: list[str]) -> list[str]:
        ids = [parse_endpoint(split_bootstrap(item)[0])[0] for item in value]
        if len(set(ids)) != len(ids):
            raise ValueError("the same engine is listed twice")
        return value


def split_bootstrap(item: str) -> tuple[str, int]:
    """``ENTRY#bootstrap=PORT`` → (ENTRY, PORT); (item, 0) without the suffix."""
    base, sep, port = item.partition("#bootstrap=")
    if not sep:
        return item, 0
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint {item!r}: bootstrap port must be 1..65535")
    return base, int(port)


def parse_endpoint(item: str) -> tuple[str, str, str]:
    """``URL`` or ``ROLE=URL`` → (instance_id "host:port", role, url). ValueError if bad."""
    role, _, url = item.rpartition("=") if "=" in item.split("://")[0] else ("", "", item)
    role = role or "worker"
    if role not in ("worker", "prefill", "decode"):
        raise ValueError(f"endpoint {item!r}: role must be worker, prefill or decode")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"endpoint {item!r}: expected an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}", role, url.rstrip("/")
