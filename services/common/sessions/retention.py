"""The retention rule: which idle sessions keep their prefix on an engine (pure).

Input: one engine's KV capacity in blocks, its idle sessions (blocks held there, predicted
return at the chosen percentile, last use, ended or not), ``now``, the budget share of the
engine's KV idle sessions may hold protected (default 0.20), and ``need_blocks``: what the
engine must free now (its pressure; 0: it has the room it needs). Output, a
:class:`RetentionPlan`:

- ``release``: ended sessions; their blocks are freed, never protected.
- ``protected``: idle sessions whose predicted return is still ahead, chosen soonest return
  first while they fit in the budget (one that does not fit is skipped, a smaller later one
  may still fit). Listed coldest first. Protected blocks are evicted last: the budget bounds
  what idle sessions hold that running requests cannot take first.
- ``offload``: under pressure only, the unprotected idle sessions coldest first until the
  need is met: the order in which the engine moves them to the tier now. Coldest means:
  overdue (the predicted return has passed: the percentile said it should have come back),
  oldest last use first; then sessions without a prediction, oldest last use first; then
  the furthest predicted return first.
- ``kept``: the other unprotected idle sessions, coldest first: they stay on the GPU while
  it has room, as ordinary cache the engine evicts on demand (to the tier when it offloads
  on eviction). Nothing is offloaded while the engine needs no room: a fetch from the tier
  is never faster than finding the prefix still on the GPU.
- ``drop``: when the tier's free room is known and short, the offloaded sessions that do
  not fit in it (the warmest that fit are offloaded, walking from the warmest); coldest
  first.

Pressure: released blocks count first, then the unprotected sessions, coldest first; if
they are not enough, protected sessions follow into ``offload`` coldest first until the
need is met. ``keep_unprotected=False`` is the eager rule: every unprotected idle session
is offloaded at once, pressure or not (``kept`` is then empty). Budget and order never
depend on anything but the inputs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_BUDGET_SHARE", "IdleSession", "RetentionPlan", "coldness", "plan_retention"]

DEFAULT_BUDGET_SHARE = 0.20


@dataclass(frozen=True, slots=True)
class IdleSession:
    key: Hashable
    blocks: int
    last_use: float
    predicted_return_at: float | None = None  # None: no prediction
    ended: bool = False


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    protected: tuple[Hashable, ...]
    offload: tuple[Hashable, ...]
    drop: tuple[Hashable, ...]
    release: tuple[Hashable, ...]
    budget_blocks: int
    protected_blocks: int
    kept: tuple[Hashable, ...] = ()  # unprotected, left on the GPU as evictable cache


def coldness(s: IdleSession, now: float) -> tuple[int, float]:
    """Sort key, coldest first (module doc)."""
    if s.predicted_return_at is None:
        return (1, s.last_use)
    if s.predicted_return_at <= now:
        return (0, s.last_use)
    return (2, -s.predicted_return_at)


def plan_retention(
    capacity_blocks: int,
    idle: Sequence[IdleSession],
    now: float,
    *,
    budget_share: float = DEFAULT_BUDGET_SHARE,
    need_blocks: int = 0,
    tier_free_blocks: int | None = None,
    keep_unprotected: bool = True,
) -> RetentionPlan:
    """Protect, keep, offload, drop and release (module doc)."""
    if capacity_blocks < 0 or need_blocks < 0 or not 0.0 <= budget_share <= 1.0:
        raise ValueError("capacity_blocks >= 0, need_blocks >= 0, budget_share in [0, 1]")
    if tier_free_blocks is not None and tier_free_blocks < 0:
        raise ValueError("tier_free_blocks must be >= 0")
    budget = int(capacity_blocks * budget_share)
    release = [s for s in idle if s.ended]
    live = [s for s in idle if not s.ended]
    ahead = sorted(
        (s for s in live if s.predicted_return_at is not None and s.predicted_return_at > now),
        key=lambda s: (s.predicted_return_at, s.last_use),
    )
    prot: list[IdleSession] = []
    used = 0
    for s in ahead:
        if used + s.blocks <= budget:
            prot.append(s)
            used += s.blocks
    prot_keys = {id(s) for s in prot}
    rest = sorted((s for s in live if id(s) not in prot_keys), key=lambda s: coldness(s, now))
    prot.sort(key=lambda s: coldness(s, now))
    freed = sum(s.blocks for s in release)
    out: list[IdleSession] = []
    kept: list[IdleSession] = []
    for s in rest:
        if freed < need_blocks or not keep_unprotected:
            out.append(s)
            freed += s.blocks
        else:
            kept.append(s)
    while prot and freed < need_blocks:
        s = prot.pop(0)
        out.append(s)
        freed += s.blocks
        used -= s.blocks
    offload, drop = _fit_tier(out, tier_free_blocks)
    return RetentionPlan(
        protected=tuple(s.key for s in prot),
        offload=tuple(s.key for s in offload),
        drop=tuple(s.key for s in drop),
        release=tuple(s.key for s in release),
        budget_blocks=budget,
        protected_blocks=used,
        kept=tuple(s.key for s in kept),
    )


def _fit_tier(
    out: list[IdleSession], room: int | None
) -> tuple[list[IdleSession], list[IdleSession]]:
    """Offload what fits in the tier's room, warmest first; the rest is dropped."""
    if room is None:
        return out, []
    fits: set[int] = set()
    for s in reversed(out):
        if s.blocks <= room:
            fits.add(id(s))
            room -= s.blocks
    return [s for s in out if id(s) in fits], [s for s in out if id(s) not in fits]
