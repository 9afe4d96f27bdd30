"""The dispatch order's settings and the shipped gateway's values for them
(:mod:`.shaper` holds the order itself)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DISPATCH_FOLLOW_MS",
    "DISPATCH_HOLD_MS",
    "DISPATCH_ORDER",
    "DISPATCH_PROTECT_WHEN_MISSED",
    "SMALL_SHARE",
    "ShaperConfig",
]

# The shipped gateway's threshold (benchmarks/README.md, "Dispatch order"): about half an
# engine step with a long prompt's chunk, so the engine always has the next prompt queued.
DISPATCH_HOLD_MS = 150.0
DISPATCH_ORDER: Literal["shortest", "slo"] = "slo"
# The shipped gateway's bound on a follower's wait (benchmarks/README.md, "Followers wait
# for their carrier"): chosen as a bound against starvation, not tuned; a shorter one lets
# followers go before their carrier's first byte on busy instances (10 s measured less).
DISPATCH_FOLLOW_MS = 30_000.0
# dispatch_protect "auto": protection while at least this share of the recent offers were
# predicted to miss their TTFT deadline (benchmarks/README.md, "Protection only under
# overload"): at the overloaded agentic cell most offers are; below saturation few.
DISPATCH_PROTECT_WHEN_MISSED = 0.7
# A prompt whose predicted prefill is under this share of the threshold goes at once: it
# delays whatever waits by little, and holding it would cost the gateway more than it saves
# (at saturation with short prompts, the futures and timers were +12 % CPU per request).
SMALL_SHARE = 0.125


@dataclass(frozen=True, slots=True)
class ShaperConfig:
    # Hold requests for an instance while its predicted prefill backlog is at least this
    # (ms). 0 turns the shaper off (every request goes at once).
    hold_above_ms: float = 0.0
    # Priority a waiting request gains per ms waited, in ms of predicted prefill.
    age_weight: float = 1.0
    # "shortest": shortest predicted prefill first (with ageing); "slo": requests that can
    # still meet their TTFT deadline first, by latest start, then the rest shortest first.
    order: Literal["shortest", "slo"] = DISPATCH_ORDER
    # Hold a request whose prefix another unanswered request is still computing on its
    # instance until that one's first byte, at most this long (ms); 0 = off.
    follow_max_ms: float = 0.0
    # Hold requests that cannot meet their TTFT deadline while the instance serves one that
    # still can (until its first byte), each at most its offered bound (:mod:`.protect`).
    protect: bool = False
    # protection's budget: False, none (while guarded, every prompt but the smallest waits);
    # True, the guards' smallest predicted slack (:mod:`.protect`)
    protect_slack: bool = False
    # protection only while the fleet is overloaded: at least this share of the recent
    # offers (with a TTFT deadline) were predicted to miss it when offered, their
    # instance's backlog plus their own need past the deadline (:mod:`.protect`); 0: always
    protect_when_missed: float = 0.0
    # weight of each offer in that share (a moving average)
    protect_miss_alpha: float = 0.05
