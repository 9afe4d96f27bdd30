"""Hot-spot rebalancing in kvmeta's retention controller (thin shell over
:func:`~services.common.sessions.rebalance.plan_rebalance`).

Each tick, per deployment, the engines that home a live session and answered the
controller's ``GET`` (capacity, free blocks, a KV-cache tier) are weighed by their active
sessions' KV (:func:`~services.common.sessions.migration.active_kv`); the rule picks idle
sessions to leave a hot engine. A move is told to the engines in the tick's own ``POST``:

- the source offloads the session's chain (its blocks no other session homed there shares)
  and stops protecting it: the blocks go to the tier, the room is free;
- the session is re-homed on the destination with its prefix on the CPU tier: from then on
  it is an offloaded session of the destination's, which the prefetch rule brings back
  there before its predicted return (at least ``min_lead_s`` ahead, so its stores have
  landed in the tier by then), or its next turn fetches at admission; the destination's KV
  events then show the prefix there, and the gateways route its next turn by them, as
  after a scale-in migration.

Only engines with a KV-cache tier take part (one without could neither pass the KV on nor
fetch it): real engines (vLLM, SGLang) serve no ``/tideserve/retention`` route, so there is
nothing to rebalance with them.
A session moved is not moved again for ``cooldown_s``. An engine homing no session is not a
destination (kvmeta cannot tell a decode engine from a prefill engine by its index entry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from services.common.sessions import Phase, Session, SessionKey, migrant
from services.common.sessions.controller import EngineRetention
from services.common.sessions.migration import active_kv
from services.common.sessions.prefetching import offloaded
from services.common.sessions.rebalance import (
    InstanceKV,
    Rebalance,
    RebalanceParams,
    leaving_blocks,
    plan_rebalance,
)

__all__ = ["Rebalancer"]


@dataclass
class Rebalancer:
    params: RebalanceParams = field(default_factory=RebalanceParams)
    window_s: float = 300.0  # a session is active when its last turn ended this recently
    cooldown_s: float = 120.0
    _moved_at: dict[SessionKey, float] = field(default_factory=dict)

    def plan(
        self,
        rows: Sequence[Session],
        chains: Mapping[SessionKey, Sequence[int]],
        infos_by: Mapping[str, dict[str, Any] | None],
        now: float,
    ) -> list[Rebalance]:
        """This tick's moves over every deployment (module doc)."""
        recent = {k for k, at in self._moved_at.items() if now - at < self.cooldown_s}
        self._moved_at = {k: at for k, at in self._moved_at.items() if k in recent}
        able = {iid for iid, info in infos_by.items() if info is not None and _has_tier(info)}
        moves: list[Rebalance] = []
        for dep in sorted({s.deployment for s in rows}):
            mine = [s for s in rows if s.deployment == dep]
            homes = sorted({s.home_instance for s in mine if s.phase is not Phase.ENDED} & able)
            if len(homes) < 2:
                continue
            blocks = {s.key: len(c) for s in mine if (c := chains.get(s.key))}
            kv = active_kv(mine, blocks, homes, now, self.window_s)
            insts = [_instance(iid, infos_by[iid], kv[iid]) for iid in homes]
            idle: dict[str, list[Any]] = {}
            for s in mine:
                if s.phase is Phase.IDLE and s.key in blocks and not offloaded(s):
                    idle.setdefault(s.home_instance, []).append(migrant(s, blocks[s.key]))
            moves += plan_rebalance(insts, idle, now, self.params, recently_moved=recent)
        for mv in moves:
            self._moved_at[mv.key] = now
        return moves

    @staticmethod
    def apply(
        moves: Sequence[Rebalance],
        plans: dict[str, EngineRetention],
        rows: Sequence[Session],
        chains: Mapping[SessionKey, Sequence[int]],
    ) -> None:
        """Each move's chain into its source's offload list and out of its protect list
        (in place; the blocks another session homed there shares stay)."""
        for mv in moves:
            gone = leaving_blocks(mv, rows, chains)
            p = plans.get(mv.source)
            if p is not None:
                drop = set(gone)
                protect = tuple(h for h in p.protect if h not in drop)
                offload = tuple(dict.fromkeys((*p.offload, *gone)))
                plans[mv.source] = replace(p, protect=protect, offload=offload)


def _has_tier(info: Mapping[str, Any]) -> bool:
    """The engine stores what it offloads in a KV-cache tier and fetches from it."""
    return bool(info.get("kvcache_tier"))


def _instance(iid: str, info: Mapping[str, Any] | None, active: int) -> InstanceKV:
    info = info or {}
    return InstanceKV(
        iid, int(info.get("capacity_blocks", 0)), active, int(info.get("free_blocks", 0))
    )
