"""Prefetch timing and fetch-or-recompute for an offloaded session prefix (pure).

Costs come from the performance model (:class:`~services.common.perfmodel.PerfProfile`):
recomputing a prefix is the prefill time it adds to the turn (the turn with the prefix
uncached minus the turn with it cached); fetching it is the tier link's latency plus its
bytes over the link's bandwidth.

- :func:`plan_prefetch`: whether to prefetch at all (only when fetching is faster than
  recomputing) and when to start: the predicted return minus the fetch time stretched by
  ``margin_ratio`` and ``margin_s``, never before ``now``.
- :func:`on_arrival`: what the turn does when it arrives. A prefetch already done is used; one
  in flight is waited for only while what is left of it is shorter than recomputing; one not
  started is started only when fetching beats recomputing. A late prefetch therefore never
  delays the turn more than recomputing would (by the model's estimates).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.common.perfmodel import PerfProfile

__all__ = [
    "Arrival",
    "PrefetchPlan",
    "TierLink",
    "fetch_ms",
    "on_arrival",
    "plan_prefetch",
    "recompute_ms",
]


@dataclass(frozen=True, slots=True)
class TierLink:
    """The path from the tier to the engine: bytes/s and a fixed cost per transfer."""

    bandwidth_bytes_s: float
    latency_ms: float = 0.0

    @classmethod
    def of(cls, profile: PerfProfile) -> TierLink:
        """The profile's KV hand-off link (instance to instance) as the tier's link."""
        return cls(profile.link_bandwidth, profile.link_latency_ms)


def fetch_ms(tokens: int, kv_bytes_per_token: int, link: TierLink) -> float:
    """Time to bring ``tokens`` of KV from the tier (0 for none)."""
    if tokens <= 0:
        return 0.0
    if link.bandwidth_bytes_s <= 0:
        return float("inf")
    return link.latency_ms + tokens * kv_bytes_per_token / link.bandwidth_bytes_s * 1e3


def recompute_ms(profile: PerfProfile, prefix_tokens: int, suffix_tokens: int = 0) -> float:
    """Prefill time ``prefix_tokens`` add to a turn with ``suffix_tokens`` new tokens."""
    if prefix_tokens <= 0:
        return 0.0
    full = profile.prefill_ms(prefix_tokens + suffix_tokens)
    cached = profile.prefill_ms(suffix_tokens, prefix_tokens) if suffix_tokens > 0 else 0.0
    return max(0.0, full - cached)


@dataclass(frozen=True, slots=True)
class PrefetchPlan:
    fetch: bool  # False: recomputing is no slower; leave the prefix on the tier
    start_at: float  # epoch seconds to start the transfer (meaningful when fetch)
    fetch_ms: float
    recompute_ms: float


def plan_prefetch(
    predicted_return_at: float,
    now: float,
    *,
    fetch_cost_ms: float,
    recompute_cost_ms: float,
    margin_ratio: float = 0.2,
    margin_s: float = 0.5,
) -> PrefetchPlan:
    """When to start bringing the prefix back (module doc)."""
    if margin_ratio < 0 or margin_s < 0:
        raise ValueError("margins must be >= 0")
    if fetch_cost_ms >= recompute_cost_ms:
        return PrefetchPlan(False, predicted_return_at, fetch_cost_ms, recompute_cost_ms)
    lead_s = fetch_cost_ms / 1e3 * (1.0 + margin_ratio) + margin_s
    start = max(now, predicted_return_at - lead_s)
    return PrefetchPlan(True, start, fetch_cost_ms, recompute_cost_ms)


class Arrival(enum.StrEnum):
    USE = "use"  # the prefix is back on the engine
    WAIT = "wait"  # a prefetch in flight finishes sooner than recomputing would
    FETCH = "fetch"  # start the fetch now: it beats recomputing
    RECOMPUTE = "recompute"  # recomputing is sooner; a prefetch in flight is abandoned


def on_arrival(
    now: float,
    *,
    fetch_cost_ms: float,
    recompute_cost_ms: float,
    started_at: float | None = None,
    done: bool = False,
    done_fraction: float | None = None,
) -> Arrival:
    """What a turn arriving at ``now`` does with its offloaded prefix (module doc). The time
    left of a prefetch in flight is ``fetch_cost_ms`` scaled by the fraction not yet moved
    when the data plane reports it, else the modelled end ``started_at + fetch_cost``."""
    if done:
        return Arrival.USE
    if started_at is not None:
        if done_fraction is not None:
            left = fetch_cost_ms * (1.0 - min(1.0, max(0.0, done_fraction)))
        else:
            left = max(0.0, started_at * 1e3 + fetch_cost_ms - now * 1e3)
        return Arrival.WAIT if left < recompute_cost_ms else Arrival.RECOMPUTE
    return Arrival.FETCH if fetch_cost_ms < recompute_cost_ms else Arrival.RECOMPUTE
