"""Agent memory's session moves in the simulator (:class:`SessionMoves`, a part of
:class:`~services.sim.memory.AgentMemory`): scale-in migration of a leaving engine's
sessions, hot-spot rebalancing, and the figures both are weighed and measured by (module doc
of :mod:`services.sim.memory`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import PerfProfile
from services.common.sessions import (
    Destination,
    Fate,
    MigrationPlan,
    Phase,
    Session,
    SessionKey,
    SessionTable,
    TierLink,
    fetch_ms,
    homes_kv,
    migrant,
    plan_migration,
    rendezvous_home,
    route_key,
)
from services.common.sessions.migration import Placement, active_sessions
from services.common.sessions.rebalance import InstanceKV, leaving_blocks, plan_rebalance
from services.sim.scalein import kept_prefix

__all__ = ["PendingFetch", "SessionMoves", "room"]


@dataclass(slots=True)
class PendingFetch:
    """A fetch of a session's prefix from the tier to ``iid`` (prefetch or a move's)."""

    iid: str
    started_ms: float
    done_ms: float


class SessionMoves:
    """The moves of sessions between engines; :class:`~services.sim.memory.AgentMemory`
    holds the state it reads (declared here for the type checker)."""

    caches: Mapping[str, KVCache]
    perf: PerfProfile
    block_size: int
    placement: Placement
    window_s: float
    rebalance_cooldown_s: float
    table: SessionTable
    link: TierLink
    moved: list[tuple[str, str, tuple[int, ...]]]
    rebalanced: list[tuple[str, str, tuple[int, ...]]]
    _chains: dict[SessionKey, tuple[int, ...]]
    _moved_at: dict[SessionKey, float]
    _applied: dict[str, tuple[Any, Any]]
    mode: str
    counts: dict[str, int]
    _tier: OrderedDict[int, None]
    tier_blocks: int
    _prefetch: dict[SessionKey, PendingFetch]

    @property
    def offloads(self) -> bool:
        return self.mode != "lru"

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def after_step(self, cache: KVCache) -> bool:
        """Blocks the step evicted go to the tier (offload on eviction) and their slots are
        freed; True when there were any."""
        if not self.offloads:
            return False
        pairs = cache.drain_evicted()
        if not pairs:
            return False
        self._to_tier([h for h, _ in pairs])
        cache.offloaded(pairs)
        return True

    def _to_tier(self, hashes: Sequence[int]) -> None:
        tier = self._tier
        for h in hashes:
            tier[h] = None
            tier.move_to_end(h)
        while len(tier) > self.tier_blocks:
            tier.popitem(last=False)

    def session_blocks(self) -> dict[str, int]:
        """Per home engine, the blocks of its live sessions' chains (victim cost)."""
        sizes = {k: len(c) for k, c in self._chains.items()}
        return {iid: h.blocks for iid, h in homes_kv(self.table.rows(), sizes).items()}

    def active_blocks(self, now: float, window_s: float) -> dict[str, int]:
        """Per home engine, the blocks of its active sessions' chains (a turn in flight,
        one ended within ``window_s``, or a predicted return ahead): the KV its sessions
        bring back soon, where :meth:`session_blocks` also counts sessions long gone quiet."""
        out: dict[str, int] = {}
        rows = self.table.rows()
        for iid in {s.home_instance for s in rows if s.home_instance}:
            for s in active_sessions(rows, iid, now / 1000.0, window_s):
                out[iid] = out.get(iid, 0) + len(self._chains.get(s.key, ()))
        return out

    def migrate(self, iid: str, stay: Sequence[str], now: float) -> MigrationPlan | None:
        """Engine ``iid`` leaves: its sessions' fate (module doc); None outside the offload
        modes (the engines' LRU only: nothing moves, as before). ``moved`` lists, per
        session moved, its destination and chain: the caller tells the gateways (the KV
        events of the destination's fetch would)."""
        cache = self.caches.get(iid)
        self.moved = []
        if not self.offloads or cache is None:
            return None
        rows = [s for s in self.table.rows() if s.home_instance == iid]
        held = {s.key: cache.match(list(self._chains.get(s.key, ()))) for s in rows}
        homed = self.active_blocks(now, self.window_s)
        dests = [
            Destination(d, room(self.caches[d]), homed.get(d, 0)) for d in stay if d in self.caches
        ]
        plan = plan_migration([migrant(s, held[s.key]) for s in rows], dests, now / 1000.0,
                              placement=self.placement)  # fmt: skip
        by_key = {s.key: s for s in rows}
        for mv in plan.moves:
            s = by_key[mv.key]
            if s.phase is Phase.ENDED:
                continue
            chain = self._chains.get(s.key, ())
            if mv.fate is not Fate.DROP:
                self._to_tier(chain[: mv.blocks])
            self._count(f"migrate_{mv.fate.value}")
            home = mv.instance or rendezvous_home(
                route_key(s.session_id, s.parent_session_id), list(stay)
            )
            if home:
                self.table.set_placement(s.key, now / 1000.0, home_instance=home, tiers={})
            if mv.fate is Fate.MOVE and home and chain:
                self._fetch_to(s.key, home, chain, now)
                self.moved.append((s.session_id, home, tuple(chain)))
        return plan

    def _fetch_to(self, key: SessionKey, iid: str, chain: Sequence[int], now: float) -> None:
        """A moved session's prefix starts coming from the tier to its new home now (the
        destination's fetch; its next turn there uses it, or waits for what is left)."""
        f_ms = fetch_ms(len(chain) * self.block_size, self.perf.kv_bytes_per_token, self.link)
        self._prefetch[key] = PendingFetch(iid, now, now + f_ms)
        self._count("move_fetch")

    def active_chains(self, iid: str, now: float, window_s: float) -> dict[str, tuple[int, ...]]:
        """The prefix chains of ``iid``'s active sessions at ``now`` (by session id; see
        :func:`~services.common.sessions.migration.active_sessions`), those with a finished turn."""
        rows = active_sessions(self.table.rows(), iid, now / 1000.0, window_s)
        return {s.session_id: self._chains[s.key] for s in rows if s.key in self._chains}

    def kept_blocks(self, chain: Sequence[int], without: str = "") -> int:
        """Blocks of ``chain`` still cached on an engine's GPU (not ``without``'s) and the
        tier (:func:`~services.sim.scalein.kept_prefix`)."""
        runs = [c.match(list(chain)) for i, c in self.caches.items() if i != without]
        return kept_prefix(chain, runs, self._tier.__contains__)

    def _rebalance(self, rows: Sequence[Session], now: float) -> None:
        """Hot-spot rebalancing (:func:`~services.common.sessions.rebalance.plan_rebalance`),
        as kvmeta's controller does it: each move's chain goes from its engine's GPU to the
        tier and the session is re-homed on the destination, an offloaded session of its
        own there (prefetch brings it back before its return, else its turn fetches it);
        ``rebalanced`` tells the gateways."""
        t = now / 1000.0
        cool = t - self.rebalance_cooldown_s
        recent = {k for k, at in self._moved_at.items() if at > cool}
        homed = self.active_blocks(now, self.window_s)
        insts = [
            InstanceKV(iid, c.capacity_blocks, homed.get(iid, 0), room(c))
            for iid, c in self.caches.items()
        ]
        idle: dict[str, list[Any]] = {}
        for s in rows:
            chain = self._chains.get(s.key)
            c = self.caches.get(s.home_instance)
            if s.phase is Phase.IDLE and chain and c is not None:
                idle.setdefault(s.home_instance, []).append(migrant(s, c.match(list(chain))))
        by_key = {s.key: s for s in rows}
        for mv in plan_rebalance(insts, idle, t, recently_moved=recent):
            chain = self._chains[mv.key]
            src = self.caches[mv.source]
            gone = leaving_blocks(mv, rows, self._chains)
            src.unprotect(gone)
            src.evict_now(gone)
            self.after_step(src)
            self.table.set_placement(mv.key, t, home_instance=mv.destination, tiers={})
            self._moved_at[mv.key] = t
            self._applied.pop(mv.source, None)
            self.rebalanced.append((by_key[mv.key].session_id, mv.destination, tuple(chain)))
            self._count("rebalance_move")


def room(c: KVCache) -> int:
    """Blocks a moved session can take on ``c``: all but those in use or protected (cached
    blocks of no one's protection are evicted on demand)."""
    return max(0, c.capacity_blocks - c.referenced_blocks - c.protected_blocks)
