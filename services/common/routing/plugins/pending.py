"""What this gateway has outstanding per instance: one amount per unanswered pick (pure).

Used by plugins that count their own picks until they answer (ttft-cost's interference,
the P/D decider's prefill backlog).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PendingPicks"]


class PendingPicks:
    """``totals[instance]`` = sum of the amounts of its picks not settled yet.

    A pick is forgotten when settled (:meth:`drop`, idempotent) or, at the next :meth:`add`
    or :meth:`expire`, once older than ``ttl_s`` (a lost settle must not pin an instance).
    An instance stays in ``totals`` at 0 once seen, so callers can tell an idle known
    instance from an unknown one. ``now`` must not go backwards across calls.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.totals: dict[str, int] = {}
        # when a set: the instances whose total changed since its owner last cleared it (a
        # follower of ``totals`` installs it, and then reads only those)
        self.touched: set[str] | None = None
        self._picks: OrderedDict[str, tuple[str, int, float]] = OrderedDict()

    def add(self, request_id: str, instance_id: str, amount: int, now: float) -> None:
        """Count ``amount`` on ``instance_id`` until ``request_id`` settles (replacing any
        earlier pick of the same request), then expire old picks."""
        self.drop(request_id)
        self._picks[request_id] = (instance_id, amount, now)
        self.totals[instance_id] = self.totals.get(instance_id, 0) + amount
        if self.touched is not None:
            self.touched.add(instance_id)
        self.expire(now)

    def expire(self, now: float) -> None:
        """Forget picks made before ``now - ttl_s``."""
        cutoff = now - self.ttl_s
        picks = self._picks
        while picks:
            rid, (_, _, at) = next(iter(picks.items()))
            if at >= cutoff:
                break
            self.drop(rid)

    def drop(self, request_id: str) -> None:
        rec = self._picks.pop(request_id, None)
        if rec is not None:
            self.totals[rec[0]] -= rec[1]
            if self.touched is not None:
                self.touched.add(rec[0])
