"""The retention controller's decision for one tick (pure): per engine, which session
blocks to protect and which to offload, from the session table's snapshot.

Input: the sessions (any phase), each one's block-hash chain on its home instance (its last
turn's prompt, parent first; a session without a chain has nothing to place), each engine's
KV capacity in blocks (and optionally what it must free now and the tier's free room), and
``now``. Per engine, its idle and ended sessions go through
:func:`~services.common.sessions.retention.plan_retention` (a session's size is its chain's
length); an ACTIVE session's turn has arrived and is held (below).

Output per engine, an :class:`EngineRetention`:

- ``protect``: every block of the held and protected sessions' chains. The engine replaces
  its marks with exactly these (blocks of sessions no longer protected lose theirs);
- ``offload``: blocks of the offloaded sessions' chains (under pressure only: the engine's
  ``need_blocks``; or every unprotected session with ``keep_unprotected=False``) that no
  protected chain holds (two
  sessions may share blocks: a sub-agent starts from its parent's prefix), the coldest
  session's first, each chain leaf first (an offloaded prefix's extensions go before it);
- ``plan``: the retention plan behind it (keys are :data:`SessionKey`).

Kept, dropped and released sessions only lose their marks: plain LRU evicts them when the
engine needs the room (a kept session's blocks go to the tier then, on an engine that
offloads on eviction).

``hold``: sessions whose prefix a prefetch is bringing back (or brought back) for their next
turn (:mod:`services.common.sessions.prefetching`). They stay out of the retention rule, so
they are never offloaded again before that turn, and their chains are protected first,
outside the budget: a prefetch starts only a short lead before the predicted return.
ACTIVE sessions are held the same way: their turn has arrived and reuses the chain on its
home, so the chain is protected until the engine takes the turn (evicting it while the
turn waits in the queue would make the turn recompute it). Once admitted, the engine
references the blocks itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from services.common.sessions.model import Phase, Session, SessionKey
from services.common.sessions.retention import (
    DEFAULT_BUDGET_SHARE,
    IdleSession,
    RetentionPlan,
    plan_retention,
)

__all__ = ["EngineKV", "EngineRetention", "plan_engines"]


@dataclass(frozen=True, slots=True)
class EngineKV:
    """What the controller knows of one engine's KV: capacity, what it must free now, the
    tier's free room (None: unknown or unbounded)."""

    capacity_blocks: int
    need_blocks: int = 0
    tier_free_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class EngineRetention:
    protect: tuple[int, ...]
    offload: tuple[int, ...]
    plan: RetentionPlan


def _idle(s: Session, blocks: int) -> IdleSession:
    ended = s.phase is Phase.ENDED
    ahead = s.predicted_return_at if s.predicted_return_at > 0 and not ended else None
    return IdleSession(s.key, blocks, s.last_turn_end, ahead, ended)


def plan_engines(
    sessions: Sequence[Session],
    chains: Mapping[SessionKey, Sequence[int]],
    engines: Mapping[str, EngineKV],
    now: float,
    *,
    budget_share: float = DEFAULT_BUDGET_SHARE,
    hold: Collection[SessionKey] = (),
    keep_unprotected: bool = True,
) -> dict[str, EngineRetention]:
    """One tick's protect and offload lists per engine (module doc). Every engine of
    ``engines`` gets an answer (an empty one clears its marks); sessions whose home is not
    in ``engines`` are skipped."""
    homed: dict[str, list[Session]] = {iid: [] for iid in engines}
    held: dict[str, list[Session]] = {iid: [] for iid in engines}
    for s in sessions:
        if s.home_instance not in homed or not chains.get(s.key):
            continue
        if s.phase is Phase.ACTIVE or s.key in hold:
            held[s.home_instance].append(s)
        else:
            homed[s.home_instance].append(s)
    out: dict[str, EngineRetention] = {}
    for iid, kv in engines.items():
        mine = homed[iid]
        plan = plan_retention(
            kv.capacity_blocks,
            [_idle(s, len(chains[s.key])) for s in mine],
            now,
            budget_share=budget_share,
            need_blocks=kv.need_blocks,
            tier_free_blocks=kv.tier_free_blocks,
            keep_unprotected=keep_unprotected,
        )
        protect: dict[int, None] = {}
        for s in held[iid]:
            protect.update(dict.fromkeys(chains[s.key]))
        for key in plan.protected:
            protect.update(dict.fromkeys(chains[key]))  # type: ignore[index]
        offload: dict[int, None] = {}
        for key in plan.offload:
            for h in reversed(chains[key]):  # type: ignore[index]
                if h not in protect:
                    offload[h] = None
        out[iid] = EngineRetention(tuple(protect), tuple(offload), plan)
    return out
