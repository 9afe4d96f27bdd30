"""Hot-spot rebalancing of agent sessions (pure): which idle sessions leave an overloaded
instance, and for where.

A session's later turns follow its KV, so the instance a new session's first turn lands on
carries that session's load for as long as it lives. A few placement decisions can leave
one instance holding most of the sessions: its KV fills with their prefixes (retention
offloads and fetches them back turn after turn), its queue grows, while another instance
idles. Scale-in migration moves sessions only when an instance leaves; this moves some of
a hot instance's idle sessions while it stays, so that their next turns are served where
there is room.

Input: per instance, its KV capacity in blocks, the blocks of the *active* sessions homed
there (:func:`~services.common.sessions.migration.active_kv`: the KV its sessions bring
back soon), the blocks a moved session could take (room), and the idle sessions homed there
(:class:`~services.common.sessions.migration.Migrant`); sessions moved recently (not moved
again) and ``now``.

Rule (:class:`RebalanceParams`): the instance with the most active session KV is *hot* when
that KV is at least ``hot_share`` of its capacity and at least ``hot_ratio`` times the
mean over the instances. Its idle sessions whose predicted return is at least ``min_lead_s``
ahead (time for the KV to move before the turn; a session with no prediction may never
return and is left alone), largest first, move one by one to the instance with the least
active session KV that has room for them, while the move narrows the gap (the destination
stays below the hot instance after it) and at most ``max_moves`` per round. Each move
counts: the hot instance's load falls, the destination's rises, before the next is placed.
A fleet of one instance, or one with no hot instance, gets no moves.

The caller executes a move as a scale-in migration does: the source offloads the chain to
the tier (freeing its room) and the session is re-homed on the destination, which fetches
the chain before the predicted return (prefetch) or at the turn; the destination's KV events
tell the gateways, so its next turn is routed there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from services.common.sessions.migration import Migrant
from services.common.sessions.model import Phase, Session, SessionKey

__all__ = ["InstanceKV", "Rebalance", "RebalanceParams", "leaving_blocks", "plan_rebalance"]


@dataclass(frozen=True, slots=True)
class RebalanceParams:
    hot_share: float = 0.5  # (0, 1]
    hot_ratio: float = 1.5  # > 1
    min_lead_s: float = 5.0  # >= 0
    max_moves: int = 4  # >= 1

    def __post_init__(self) -> None:
        if not 0 < self.hot_share <= 1 or self.hot_ratio <= 1:
            raise ValueError("hot_share must be in (0, 1] and hot_ratio > 1")
        if self.min_lead_s < 0 or self.max_moves < 1:
            raise ValueError("min_lead_s must be >= 0 and max_moves >= 1")


@dataclass(frozen=True, slots=True)
class InstanceKV:
    """One instance as the rule weighs it."""

    instance_id: str
    capacity_blocks: int
    active_blocks: int  # the active sessions homed here (their chains)
    room_blocks: int  # what a moved session can take here


@dataclass(frozen=True, slots=True)
class Rebalance:
    key: SessionKey
    source: str
    destination: str
    blocks: int


def plan_rebalance(
    instances: Sequence[InstanceKV],
    idle: Mapping[str, Sequence[Migrant]],
    now: float,
    params: RebalanceParams | None = None,
    *,
    recently_moved: Collection[SessionKey] = (),
) -> tuple[Rebalance, ...]:
    """The moves of one round (module doc), in the order they were placed."""
    p = params or RebalanceParams()
    if len(instances) < 2:
        return ()
    if any(i.capacity_blocks < 0 or i.active_blocks < 0 or i.room_blocks < 0 for i in instances):
        raise ValueError("capacity, active and room blocks must be >= 0")
    load = {i.instance_id: float(i.active_blocks) for i in instances}
    room = {i.instance_id: i.room_blocks for i in instances}
    hot = max(instances, key=lambda i: (i.active_blocks, i.instance_id))
    mean = sum(load.values()) / len(load)
    if (
        hot.active_blocks < p.hot_share * hot.capacity_blocks
        or hot.active_blocks < p.hot_ratio * mean
    ):
        return ()
    src = hot.instance_id
    movable = [
        m
        for m in idle.get(src, ())
        if m.phase is Phase.IDLE
        and m.blocks > 0
        and m.key not in recently_moved
        and m.predicted_return_at is not None
        and m.predicted_return_at - now >= p.min_lead_s
    ]
    moves: list[Rebalance] = []
    for m in sorted(movable, key=lambda m: (-m.blocks, m.key)):
        if len(moves) >= p.max_moves:
            break
        fits = [i for i in load if i != src and room[i] >= m.blocks]
        if not fits:
            continue
        dest = min(fits, key=lambda i: (load[i], -room[i], i))
        if load[dest] + m.blocks > load[src] - m.blocks:
            continue  # would overshoot: the destination would become the hotter one
        load[src] -= m.blocks
        load[dest] += m.blocks
        room[dest] -= m.blocks
        moves.append(Rebalance(m.key, src, dest, m.blocks))
    return tuple(moves)


def leaving_blocks(
    mv: Rebalance, rows: Sequence[Session], chains: Mapping[SessionKey, Sequence[int]]
) -> list[int]:
    """The blocks ``mv`` takes off its source, leaf first: the first ``mv.blocks`` of the
    session's chain, but those another session homed there shares (a sub-agent's parent
    prefix stays for the sessions that keep using it)."""
    shared = {
        h
        for s in rows
        if s.key != mv.key and s.home_instance == mv.source
        for h in chains.get(s.key, ())
    }
    return [h for h in reversed(chains[mv.key][: mv.blocks]) if h not in shared]
