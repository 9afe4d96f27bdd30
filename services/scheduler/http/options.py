"""The gateway's options (:class:`GatewayOptions`, built from the scheduler's settings in
``compose``): names, limits, retries, timings, the tokenization path and the client APIs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from services.common.admission.shaper_config import (
    DISPATCH_FOLLOW_MS,
    DISPATCH_HOLD_MS,
    DISPATCH_ORDER,
    DISPATCH_PROTECT_WHEN_MISSED,
)
from services.common.tokens import TokenPath
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE
from services.scheduler.http.openai import Limits

__all__ = ["GatewayOptions", "authorization"]


@dataclass(frozen=True, slots=True)
class GatewayOptions:
    models: tuple[str, ...] = ()
    deployment: str = ""
    block_size: int = DEFAULT_BLOCK_SIZE
    retries: int = 2
    backoff_ms: float = 20.0
    health_interval_s: float = 1.0
    load_interval_s: float = 0.5
    probe_timeout_s: float = 1.0
    connect_timeout_s: float = 3.0
    upstream_timeout_s: float = 600.0
    queue_tick_s: float = 0.05
    limits: Limits = field(default_factory=Limits)
    tenants: frozenset[str] | None = None
    background: bool = True
    # Scheduler profile for requests that do not name one ("" = the config's default).
    profile: str = ""
    # How disaggregated picks talk to the engines (per deployment).
    pd_protocol: Literal["sglang", "vllm"] = "sglang"
    # Pre-empt lower classes before their first byte when a higher class waits.
    preemption: bool = True
    # Dispatch order (admission.shaper): hold picks while their instance has this much
    # predicted prefill outstanding, and send them in ``dispatch_order``; 0 = off.
    dispatch_hold_ms: float = DISPATCH_HOLD_MS
    dispatch_age_weight: float = 1.0
    dispatch_order: Literal["shortest", "slo"] = DISPATCH_ORDER
    # Hold a pick whose prefix an unanswered pick is still computing on its instance until
    # that pick's first byte, at most this long (ms); 0 = off (admission.follow).
    dispatch_follow_ms: float = DISPATCH_FOLLOW_MS
    # While an instance serves a request that can still meet its TTFT (until its first
    # byte), hold other prompts for it, at most the class's starve_after_ms
    # (admission.protect): off, guard (all but the smallest), slack, or auto (guard while at
    # least dispatch_protect_when_missed of the recent offers were predicted late).
    dispatch_protect: Literal["off", "guard", "slack", "auto"] = "off"
    dispatch_protect_when_missed: float = DISPATCH_PROTECT_WHEN_MISSED
    # Tokenizer + block-hash scheme of this deployment (default: the simulator's).
    tokens: TokenPath = field(default_factory=TokenPath)
    # Engine authorization: the client's Authorization header passed on, or (overriding
    # it) a fixed key sent as "Authorization: Bearer KEY".
    forward_authorization: bool = False
    engine_api_key: str = field(default="", repr=False)
    # Agent tool calls on record: contents too (not only names and sizes).
    record_tool_contents: bool = False
    # Client APIs the engines serve themselves ("messages", "responses"): forwarded as they
    # came; otherwise as their canonical chat body, the answer translated back.
    native_apis: frozenset[str] = frozenset()
    # Stored responses (Responses API) are kept this long, then swept.
    responses_retention_s: float = 30 * 86400.0


def authorization(opts: GatewayOptions) -> str | bool:
    """The Forwarder's ``authorization``: a fixed header value, True (the client's), or
    False (none)."""
    if opts.engine_api_key:
        return f"Bearer {opts.engine_api_key}"
    return opts.forward_authorization
