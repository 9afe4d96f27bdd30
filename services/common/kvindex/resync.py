"""Pure decision: which stale instances should be asked for a full resync now.

No I/O, no clock: ``now`` (seconds) is a parameter. A shell (kvmeta's ``IndexFeeder``, the
scheduler's KV replica) collects the stale instances from its index, calls
:func:`plan_resyncs` with the requests it has outstanding, publishes a
``tideserve.v1.ResyncRequest`` for each instance in ``plan.send`` and keeps
``plan.outstanding`` (only once the publish succeeded, so a failed publish is retried).

Rate limit: at most one outstanding request per instance. While the instance stays stale,
the request is repeated after ``retry_after_s``, doubling with each attempt up to
``max_retry_after_s`` (an instance that never answers is asked rarely, not never: it may
answer later, or leave the index by membership/expiry). An instance that is no longer stale
has its outstanding request dropped (answered). A stale instance whose epoch differs from
the outstanding request's (it restarted) is asked at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Outstanding", "ResyncPlan", "ResyncPolicy", "StaleInstance", "plan_resyncs"]

Key = tuple[str, str]  # (deployment, instance_id)


@dataclass(frozen=True)
class StaleInstance:
    deployment: str
    instance_id: str
    epoch: int

    @property
    def key(self) -> Key:
        return (self.deployment, self.instance_id)


@dataclass(frozen=True)
class Outstanding:
    """A request sent and not yet answered."""

    epoch: int
    requested_at: float
    attempts: int = 1


@dataclass(frozen=True)
class ResyncPolicy:
    retry_after_s: float = 5.0
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.retry_after_s <= 0 or self.max_retry_after_s < self.retry_after_s:
            raise ValueError("need 0 < retry_after_s <= max_retry_after_s")

    def wait_s(self, attempts: int) -> float:
        """How long after its ``attempts``-th request an instance is asked again."""
        return min(self.max_retry_after_s, self.retry_after_s * 2.0 ** max(0, attempts - 1))


@dataclass(frozen=True)
class ResyncPlan:
    send: list[StaleInstance]  # ask these now, sorted by (deployment, instance_id)
    outstanding: dict[Key, Outstanding]  # the outstanding map once ``send`` is published


def plan_resyncs(
    stale: Iterable[StaleInstance],
    outstanding: Mapping[Key, Outstanding],
    now: float,
    policy: ResyncPolicy,
) -> ResyncPlan:
    """Decide the requests to send at ``now``. Pure; ``outstanding`` is not modified."""
    send: list[StaleInstance] = []
    out: dict[Key, Outstanding] = {}
    for inst in sorted(stale, key=lambda i: i.key):
        prev = outstanding.get(inst.key)
        if prev is None or prev.epoch != inst.epoch:
            send.append(inst)
            out[inst.key] = Outstanding(inst.epoch, now, 1)
        elif now - prev.requested_at >= policy.wait_s(prev.attempts):
            send.append(inst)
            out[inst.key] = Outstanding(inst.epoch, now, prev.attempts + 1)
        else:
            out[inst.key] = prev
    return ResyncPlan(send, out)
