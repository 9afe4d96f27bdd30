"""Where a scaled-in instance's agent sessions go (pure): the migration plan.

When the autoscaler removes an instance, the sessions homed there lose their KV unless it
goes somewhere first. Input: the victim's sessions (:class:`Migrant`: blocks held on the
victim, phase, predicted return, last use, the key the router places it by), the instances
that stay (:class:`Destination`: KV blocks free for migrated sessions, load), the tier's free
room (None: unknown or unbounded) and ``now``. Output, a :class:`MigrationPlan`: per session
one :class:`Move` with its :class:`Fate`:

- ``DROP`` for an ENDED session: nobody comes back for it;
- ``MOVE`` to a destination: the session's next turn will be served there, so its KV should
  be there. With ``placement="rendezvous"`` (default) the destination is the session's
  rendezvous home among the instances that stay
  (:func:`~services.common.sessions.homes.rendezvous_home` of its route key): the instance
  the scheduler's ``session-home`` scorer ranks first once the victim is gone, which is
  also the least disruptive choice (every other session keeps its home). When that home
  lacks room, the session goes to the tier (any instance can fetch it from there; moving it
  to an instance the router would not pick wastes that instance's KV). With
  ``placement="least_loaded"`` the destination is the least-loaded instance with room
  (load, then most free blocks, then id): for routers that follow kvmeta's recorded home.
  With ``placement="kv_spread"`` a destination's ``load`` is in KV blocks (the sessions
  already homed there, :func:`homes_kv`): each session goes to the destination with room
  whose load is least, and its blocks are added to that load before the next is placed,
  so the victim's sessions spread over the instances by the KV they bring back, not all
  onto one. The router follows such a move only when the KV lands there (the destination
  fetches it from the tier, and its KV events show the prefix there): the caller does that;
- ``TIER``: no destination has room (or its home lacks it): the blocks go to the tier;
- ``DROP`` when the tier has no room left either.

Sessions are placed warmest first: ACTIVE ones (a turn is in flight or just finished
draining), then idle ones whose predicted return is ahead, soonest first, then sessions
without a prediction and overdue ones, as the retention rule orders them
(:func:`~services.common.sessions.retention.coldness`, reversed). So when room is short, the
sessions coming back soonest keep their KV closest. The plan is a pure function of its
inputs: ties break by key.

:func:`homes_kv` is the figure the autoscaler weighs scale-in victims by: per home instance,
the live sessions homed there and their blocks and tokens. :func:`active_sessions` are the
ones of those that will want their KV soon: a turn in flight, a turn ended within a window,
or a predicted return ahead; :func:`active_kv` sums their blocks per home, the load
``kv_spread`` places by (a session that ended its last turn hours ago holds nothing a
destination must keep room for).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from services.common.sessions.homes import rendezvous_home, route_key
from services.common.sessions.model import Phase, Session, SessionKey
from services.common.sessions.retention import IdleSession, coldness

__all__ = [
    "Destination",
    "Fate",
    "HomeKV",
    "Migrant",
    "MigrationPlan",
    "Move",
    "Placement",
    "active_kv",
    "active_sessions",
    "homes_kv",
    "migrant",
    "plan_migration",
]

Placement = Literal["rendezvous", "least_loaded", "kv_spread"]


class Fate(enum.StrEnum):
    MOVE = "move"  # to a destination instance
    TIER = "tier"  # offloaded to the KV-cache tier
    DROP = "drop"  # freed with the instance


@dataclass(frozen=True, slots=True)
class Migrant:
    """One session homed on the victim."""

    key: SessionKey
    blocks: int  # blocks of its prefix held on the victim
    phase: Phase = Phase.IDLE
    route: str = ""  # the key the router places it by ("" = the session id)
    predicted_return_at: float | None = None  # None: no prediction
    last_use: float = 0.0


@dataclass(frozen=True, slots=True)
class Destination:
    """An instance that stays: KV blocks it can take for migrated sessions, and its load
    (queued plus in-flight requests, or any figure where lower is less loaded)."""

    instance_id: str
    free_blocks: int
    load: float = 0.0


@dataclass(frozen=True, slots=True)
class Move:
    key: SessionKey
    fate: Fate
    blocks: int
    instance: str = ""  # the destination of a MOVE; "" otherwise
    reason: str = ""  # why a session was not moved: "ended", "no_room", "no_destination"


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    moves: tuple[Move, ...]  # warmest first

    def of(self, fate: Fate) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if m.fate is fate)

    def blocks(self, fate: Fate) -> int:
        return sum(m.blocks for m in self.moves if m.fate is fate)


def migrant(s: Session, blocks: int) -> Migrant:
    """A session of the table as the plan weighs it (``blocks``: its chain on the victim)."""
    ahead = s.predicted_return_at if s.predicted_return_at > 0 else None
    last = max(s.last_turn_end, s.turn_started_at)
    return Migrant(
        s.key, blocks, s.phase, route_key(s.session_id, s.parent_session_id), ahead, last
    )


def _warmth(m: Migrant, now: float) -> tuple[int, float, str, str, str]:
    """Sort key, warmest first (module doc): the retention rule's coldness reversed."""
    if m.phase is Phase.ACTIVE:
        return (0, -m.last_use, *m.key)
    rank, t = coldness(IdleSession(m.key, m.blocks, m.last_use, m.predicted_return_at), now)
    return (3 - rank, -t, *m.key)


def plan_migration(
    sessions: Sequence[Migrant],
    destinations: Sequence[Destination],
    now: float,
    *,
    tier_free_blocks: int | None = None,
    placement: Placement = "rendezvous",
) -> MigrationPlan:
    """Move, offload or drop each of the victim's sessions (module doc)."""
    if any(m.blocks < 0 for m in sessions) or any(d.free_blocks < 0 for d in destinations):
        raise ValueError("blocks and free_blocks must be >= 0")
    if tier_free_blocks is not None and tier_free_blocks < 0:
        raise ValueError("tier_free_blocks must be >= 0")
    if placement not in ("rendezvous", "least_loaded", "kv_spread"):
        raise ValueError(
            f"placement must be rendezvous, least_loaded or kv_spread, got {placement!r}"
        )
    room = {d.instance_id: d.free_blocks for d in destinations}
    load = {d.instance_id: d.load for d in destinations}
    ids = sorted(room)
    tier = tier_free_blocks
    moves: list[Move] = []
    for m in sorted(sessions, key=lambda m: _warmth(m, now)):
        if m.phase is Phase.ENDED:
            moves.append(Move(m.key, Fate.DROP, m.blocks, reason="ended"))
            continue
        dest = _destination(m, ids, room, load, placement)
        if dest is not None:
            room[dest] -= m.blocks
            if placement == "kv_spread":
                load[dest] += m.blocks
            moves.append(Move(m.key, Fate.MOVE, m.blocks, dest))
            continue
        why = "no_destination" if not ids else "no_room"
        if tier is None or m.blocks <= tier:
            tier = None if tier is None else tier - m.blocks
            moves.append(Move(m.key, Fate.TIER, m.blocks, reason=why))
        else:
            moves.append(Move(m.key, Fate.DROP, m.blocks, reason="no_room"))
    return MigrationPlan(tuple(moves))


def _destination(
    m: Migrant,
    ids: Sequence[str],
    room: Mapping[str, int],
    load: Mapping[str, float],
    placement: Placement,
) -> str | None:
    if placement == "rendezvous":
        home = rendezvous_home(m.route or m.key[2], ids)
        return home if home is not None and room[home] >= m.blocks else None
    fits = [i for i in ids if room[i] >= m.blocks]
    return min(fits, key=lambda i: (load[i], -room[i], i)) if fits else None


@dataclass(frozen=True, slots=True)
class HomeKV:
    """The live sessions homed on one instance: how many, their blocks and tokens."""

    sessions: int = 0
    blocks: int = 0
    tokens: int = 0


def homes_kv(
    sessions: Sequence[Session], blocks: Mapping[SessionKey, int] | None = None
) -> dict[str, HomeKV]:
    """Per home instance, its live (ACTIVE or IDLE) sessions' KV; ``blocks`` overrides a
    session's own count (e.g. its chain's length), else its blocks per tier. Sessions
    without a home are not counted."""
    out: dict[str, HomeKV] = {}
    for s in sessions:
        if s.phase is Phase.ENDED or not s.home_instance:
            continue
        n = (blocks or {}).get(s.key, s.blocks)
        h = out.get(s.home_instance, HomeKV())
        out[s.home_instance] = HomeKV(h.sessions + 1, h.blocks + n, h.tokens + s.tip_tokens)
    return out


def active_sessions(
    rows: Sequence[Session], iid: str, now_s: float, window_s: float
) -> list[Session]:
    """The sessions homed on ``iid`` that count as active at ``now_s`` (module doc), by key."""
    out = []
    for s in rows:
        if s.home_instance != iid or s.phase is Phase.ENDED:
            continue
        recent = s.last_turn_end > 0 and now_s - s.last_turn_end <= window_s
        ahead = s.predicted_return_at > now_s
        if s.phase is Phase.ACTIVE or recent or ahead:
            out.append(s)
    return sorted(out, key=lambda s: s.key)


def active_kv(
    rows: Sequence[Session],
    blocks: Mapping[SessionKey, int],
    homes: Sequence[str],
    now_s: float,
    window_s: float,
) -> dict[str, int]:
    """Per instance of ``homes``, the blocks of its active sessions (``blocks``: each one's
    chain length, else its blocks per tier)."""
    return {
        iid: sum(blocks.get(s.key, s.blocks) for s in active_sessions(rows, iid, now_s, window_s))
        for iid in homes
    }
