"""Agent memory in the simulator (``SimConfig.agent_memory``): sessions with their think and
tool gaps, retention of idle sessions' KV on their engine, offload to a tier with a modelled
fetch time, and prefetch before the predicted return. The rules are the product's pure
cores: :class:`~services.common.sessions.SessionTable` (turns, predicted return),
:func:`~services.common.sessions.controller.plan_engines` (the retention controller's
decision), :func:`~services.common.sessions.prefetch.plan_prefetch` and
:func:`~services.common.sessions.prefetch.on_arrival`.

A session is the trace's requests sharing a first hash id (the agentic trace carries no
session id; its sessions share nothing). Modes:

- ``lru``: today's behaviour: the engines' LRU, no tier (only the measurements run);
- ``retention``: every ``tick_ms`` the controller's plan per engine is applied (protect
  within the budget; the other idle sessions stay on the GPU while it has room, as cache
  the engine's LRU evicts on demand, or with ``keep_unprotected=False``, the eager rule,
  are offloaded now), and every block the engines evict goes to the tier (offload on
  eviction); a resumed turn whose prefix is on the tier fetches it at arrival when
  fetching beats recomputing (the turn waits the fetch), else recomputes;
- ``prefetch``: ``retention`` plus prefetch: an offloaded idle session's prefix starts
  coming back ``plan_prefetch``'s lead before its predicted return (to its home engine); an
  arriving turn uses it when done, waits for it while that is shorter than recomputing.

P/D (``prefill`` + ``decode``): a session's KV is on two engines, the prefill engine that
computed its last turn (its prefix cache) and, with ``decode_keeps_kv``, the decode engine
that served it (its whole context). Its home is the decode engine, as the gateway reports it
to kvmeta; the prefill engine is kept beside it (:meth:`AgentMemory.holders`). The
controller's plan is applied per engine to the idle sessions whose KV it holds (decode
engines: protect within the budget, the rest evicted to the tier when the room is needed
instead of LRU dropping them; prefill engines the same for their prefixes); a resumed turn's prefill fetches from the tier as on
an aggregated engine, and prefetch brings a prefix back to its prefill engine (the decode
engine receives what it lacks with the hand-off).

Scale-in (with ``autoscale``, or the explicit ``scale_in_at_s`` of
:mod:`services.sim.scalein`; in the offload modes) is drain and migrate, as in the product:
when a drained engine leaves, :meth:`AgentMemory.migrate` runs
:func:`~services.common.sessions.migration.plan_migration` over the sessions homed there;
the blocks of those that move or go to the tier are offloaded to the tier, and every live
one is re-homed among the engines that stay (where the retention controller and prefetch
then act for it): with ``placement="kv_spread"`` (default) where the active sessions' KV is
least (:meth:`AgentMemory.active_blocks`), counting the sessions moved before it. A moved
session's prefix then comes from the tier to its new home at once (its next turn there uses
it, or waits for what is left), and ``moved`` lists the moves for the gateways to learn
(:meth:`~services.sim.scaling.Scaling.learn_moves`). :meth:`~AgentMemory.session_blocks` is
the planner's per-engine session-KV figure for victim choice.

The tier is one pool of ``tier_blocks`` (LRU beyond that) over the perf profile's KV link.
Not modelled: the time an offload copy takes (an evicted block's slot is free after the
step that evicted it), and the GPU room a prefetched prefix takes before its turn arrives.

Measured (:meth:`AgentMemory.summary`): per resumed turn (a session's second turn on), the
blocks of the previous turn's chain it starts with (``reusable``) and how many of them were
still cached when it arrived, on its engine's GPU or on the tier (``reuse_ratio``);
sampled each tick, the share of GPU KV idle sessions' blocks hold (``idle_kv_share``; of it
protected, evicted last: ``idle_kv_share_protected``, what the budget bounds), the share
protected for any session (``protected_kv_share``: also the chains held for arrived turns)
and of the fleet's KV in use (``fleet_kv_used``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import PerfProfile
from services.common.sessions import (
    Arrival,
    Phase,
    Session,
    SessionKey,
    SessionTable,
    TierLink,
    ToolTimePredictor,
    fetch_ms,
    on_arrival,
    plan_prefetch,
    recompute_ms,
)
from services.common.sessions.controller import EngineKV, plan_engines
from services.common.sessions.migration import Placement
from services.sim.memory_moves import PendingFetch, SessionMoves

__all__ = ["AgentMemory", "MemoryMode", "Resume"]

MemoryMode = Literal["lru", "retention", "prefetch"]
MODES: tuple[str, ...] = ("lru", "retention", "prefetch")


@dataclass(slots=True)
class Resume:
    """A resumed turn: its request index, reusable and cached blocks, what it did."""

    index: int
    reusable: int
    cached: int
    action: str


@dataclass(slots=True)
class _Turn:
    key: SessionKey
    hashes: tuple[int, ...]
    index: int
    dispatched: bool = False  # a retry's dispatch (its engine died) is not a second resume


@dataclass
class AgentMemory(SessionMoves):
    mode: str
    caches: Mapping[str, KVCache]
    perf: PerfProfile
    block_size: int
    budget_share: float = 0.2
    placement: Placement = "kv_spread"  # where a scaled-in engine's sessions move
    window_s: float = 300.0  # an active session's last turn ended at most this long ago
    keep_unprotected: bool = True  # idle sessions past the budget stay while there is room
    rebalance: bool = False  # hot-spot rebalancing each round (aggregated fleets)
    rebalance_cooldown_s: float = 120.0  # a session moved is not moved again this soon
    percentile: float = 0.9
    tier_blocks: int = 1 << 22
    tick_ms: float = 1000.0
    sample_every: int = 30  # ticks between idle-share samples
    table: SessionTable = field(init=False)
    resumes: list[Resume] = field(default_factory=list)
    _chains: dict[SessionKey, tuple[int, ...]] = field(default_factory=dict)
    _prefill_home: dict[SessionKey, str] = field(default_factory=dict)  # P/D only
    _turns: dict[str, _Turn] = field(default_factory=dict)
    _tier: OrderedDict[int, None] = field(default_factory=OrderedDict)
    _prefetch: dict[SessionKey, PendingFetch] = field(default_factory=dict)
    _idle_share: list[float] = field(default_factory=list)
    _used_share: list[float] = field(default_factory=list)
    _protected_share: list[float] = field(default_factory=list)
    _marked_share: list[float] = field(default_factory=list)
    _applied: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    _ticks: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    # instance failures: sessions that held KV on a dead engine, until their next dispatch
    _orphans: set[SessionKey] = field(default_factory=set)
    lost_sessions: int = 0
    after_failure: list[Resume] = field(default_factory=list)  # their next dispatches
    # the last migrate's moves: (session id, destination, chain)
    moved: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    # the last round's hot-spot moves, in the same shape
    rebalanced: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    _moved_at: dict[SessionKey, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"agent memory mode must be one of {MODES}, got {self.mode!r}")
        self.table = SessionTable(
            ToolTimePredictor(min_samples=20, default_gap_s=30.0),
            percentile=self.percentile,
            idle_timeout_s=1e9,
        )
        self.link = TierLink.of(self.perf)
        if self.offloads:
            for c in self.caches.values():
                c.hold_evicted = True

    # -- turns ---------------------------------------------------------------------------
    def arrive(self, rid: str, index: int, session: str, hashes: Sequence[int], now: float) -> None:
        key: SessionKey = ("sim", "", session)
        self._turns[rid] = _Turn(key, tuple(hashes), index)
        self.table.turn_start(key, now / 1000.0)

    def dispatch(self, rid: str, iid: str, prompt_tokens: int, now: float) -> tuple[int, float]:
        """(fetched tokens, fetch wait ms) of the request's submission to ``iid``."""
        turn = self._turns.get(rid)
        if turn is None:
            return 0, 0.0
        first, turn.dispatched = not turn.dispatched, True
        cache = self.caches[iid]
        prev = self._chains.get(turn.key)
        gpu = cache.match(list(turn.hashes))
        if prev is None:
            return 0, 0.0
        reusable = _common(turn.hashes, prev)
        gpu = min(gpu, reusable)
        tier = 0
        while gpu + tier < reusable and turn.hashes[gpu + tier] in self._tier:
            tier += 1
        bs = self.block_size
        fetched, wait, action = 0, 0.0, "gpu" if tier == 0 else ""
        if tier:
            suffix = max(0, prompt_tokens - (gpu + tier) * bs)
            f_ms = fetch_ms(tier * bs, self.perf.kv_bytes_per_token, self.link)
            r_ms = recompute_ms(self.perf, tier * bs, suffix)
            pf = self._prefetch.pop(turn.key, None)
            started = pf.started_ms / 1000.0 if pf is not None and pf.iid == iid else None
            done = pf is not None and pf.iid == iid and pf.done_ms <= now
            what = on_arrival(
                now / 1000.0, fetch_cost_ms=f_ms, recompute_cost_ms=r_ms,
                started_at=started, done=done,
            )  # fmt: skip
            action = what.value
            if what is not Arrival.RECOMPUTE:
                fetched = (gpu + tier) * bs
                if what is Arrival.FETCH:
                    wait = f_ms
                elif what is Arrival.WAIT and pf is not None:
                    wait = max(0.0, pf.done_ms - now)
        elif self.offloads and gpu:
            fetched, wait = self._evicted_meanwhile(gpu, prompt_tokens)
        resume = Resume(turn.index, reusable, gpu + tier, action or "gpu")
        if first:
            self._count(resume.action)
            self.resumes.append(resume)
        if turn.key in self._orphans:  # its first dispatch since an engine of it died
            self._orphans.discard(turn.key)
            self.after_failure.append(resume)
        return fetched, wait

    def _evicted_meanwhile(self, gpu: int, prompt_tokens: int) -> tuple[int, float]:
        """A turn whose prefix is on the GPU at arrival: the engine looks the tier up again
        when it admits the turn (as vLLM's KV connectors do at scheduling), so blocks
        evicted while it waited in the queue (to the tier: offload on eviction) are fetched,
        not recomputed, when fetching beats recomputing. The core uses these only when its
        own match at admission is shorter; the wait is the whole prefix's fetch (an upper
        bound)."""
        bs = self.block_size
        f_ms = fetch_ms(gpu * bs, self.perf.kv_bytes_per_token, self.link)
        if f_ms >= recompute_ms(self.perf, gpu * bs, max(0, prompt_tokens - gpu * bs)):
            return 0, 0.0
        return gpu * bs, f_ms

    def end(self, rid: str, iid: str, now: float, prefill: str = "") -> None:
        """The turn ``rid`` ended, served by ``iid`` (its home: the aggregated or decode
        engine); ``prefill``: the prefill engine that computed it (P/D)."""
        turn = self._turns.pop(rid, None)
        if turn is None:
            return
        self.table.turn_end(turn.key, now / 1000.0, home_instance=iid)
        self._chains[turn.key] = turn.hashes
        if prefill and prefill != iid:
            self._prefill_home[turn.key] = prefill
        else:
            self._prefill_home.pop(turn.key, None)

    def holders(self, s: Session) -> tuple[str, ...]:
        """The engines holding ``s``'s KV: its home, and in P/D its prefill engine."""
        p = self._prefill_home.get(s.key)
        return (s.home_instance, p) if p else (s.home_instance,)

    def _prefill_engine(self, s: Session) -> str:
        """Where ``s``'s next prefill is expected: its prefill engine in P/D, else its home."""
        return self._prefill_home.get(s.key, s.home_instance)

    def forget(self, rid: str) -> None:
        self._turns.pop(rid, None)

    def renamed(self, rid: str, new: str) -> None:
        """A turn's call was given up and is retried as ``new``."""
        turn = self._turns.pop(rid, None)
        if turn is not None:
            self._turns[new] = turn

    def engines_lost(self, dead: Sequence[str]) -> None:
        """Engines died: their GPU KV is gone (their caches already left ``caches``), what
        was offloaded stays on the tier. The sessions that held KV there are followed to
        their next dispatch (``after_failure``): a turn in flight there, retried elsewhere,
        or their next turn."""
        gone = set(dead)
        hit = {
            s.key
            for s in self.table.rows()
            if s.key in self._chains and gone & set(self.holders(s))
        }
        for iid in gone:
            self._applied.pop(iid, None)
        for key in [k for k, pf in self._prefetch.items() if pf.iid in gone]:
            del self._prefetch[key]
        self.lost_sessions += len(hit - self._orphans)
        self._orphans |= hit

    def tick(self, now: float) -> None:
        """The retention controller's round (retention modes), prefetches, samples."""
        rows = self.table.rows()
        self.rebalanced = []
        if self.offloads:
            if self.rebalance:
                self._rebalance(rows, now)
            self._retain(rows, now)
        if self.mode == "prefetch":
            self._plan_prefetches(rows, now)
        self._ticks += 1
        if self._ticks % self.sample_every == 0:
            self._sample(rows)

    def _retain(self, rows: Sequence[Any], now: float) -> None:
        """The controller's plan per engine, applied when it changed: unchanged plans need
        nothing new (their offloads are done, their marks are set; marks of blocks evicted
        under pressure are gone with the blocks, and a turn's new blocks belong to an active
        session)."""
        for iid, c in self.caches.items():
            kv = {iid: EngineKV(c.capacity_blocks)}
            # each engine plans for the sessions whose KV it holds, as their home (an ACTIVE
            # one's turn has arrived: its chain is held until the engine takes the turn)
            idle = [
                s if s.home_instance == iid else replace(s, home_instance=iid)
                for s in rows
                if s.key in self._chains and iid in self.holders(s)
            ]
            sig = tuple((s.key, s.phase, s.predicted_return_at > now / 1000.0) for s in idle)
            if self._applied.get(iid, (None, None))[0] == sig:
                continue
            p = plan_engines(idle, self._chains, kv, now / 1000.0,
                             budget_share=self.budget_share,
                             keep_unprotected=self.keep_unprotected)[iid]  # fmt: skip
            self._applied[iid] = (sig, p.plan)
            c.unprotect(None)
            c.protect(list(p.protect))
            c.evict_now(list(p.offload))
            self.after_step(c)

    def _plan_prefetches(self, rows: Sequence[Any], now: float) -> None:
        bs = self.block_size
        for s in rows:
            if s.phase is not Phase.IDLE or s.key in self._prefetch or not s.predicted_return_at:
                continue
            chain = self._chains.get(s.key)
            iid = self._prefill_engine(s)
            c = self.caches.get(iid)
            if chain is None or c is None:
                continue
            gpu = c.match(list(chain))
            tier = sum(1 for h in chain[gpu:] if h in self._tier)
            if tier == 0:
                continue
            f_ms = fetch_ms(tier * bs, self.perf.kv_bytes_per_token, self.link)
            r_ms = recompute_ms(self.perf, tier * bs, bs)
            plan = plan_prefetch(s.predicted_return_at, now / 1000.0,
                                 fetch_cost_ms=f_ms, recompute_cost_ms=r_ms)  # fmt: skip
            if plan.fetch and plan.start_at * 1000.0 <= now + self.tick_ms:
                start = max(now, plan.start_at * 1000.0)
                self._prefetch[s.key] = PendingFetch(iid, start, start + f_ms)
                self._count("prefetches")

    def _sample(self, rows: Sequence[Any]) -> None:
        held: dict[str, set[int]] = {iid: set() for iid in self.caches}
        for s in rows:
            if s.phase is Phase.ACTIVE:
                continue
            chain = self._chains.get(s.key)
            if chain is None:
                continue
            for iid in self.holders(s):
                c = self.caches.get(iid)
                if c is not None:
                    held[iid].update(chain[: c.match(list(chain))])
        cap = sum(c.capacity_blocks for c in self.caches.values())
        if cap:
            self._idle_share.append(sum(len(v) for v in held.values()) / cap)
            used = sum(c.used_blocks for c in self.caches.values())
            self._used_share.append(used / cap)
            pinned = sum(self.caches[i].count_protected(v) for i, v in held.items())
            self._protected_share.append(pinned / cap)
            marks = sum(c.protected_blocks for c in self.caches.values())
            self._marked_share.append(marks / cap)

    # -- results -------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode,
            "resumed_turns": len(self.resumes),
            "reuse_ratio": _reuse(self.resumes),
            "idle_kv_share": _mean(self._idle_share),
            "idle_kv_share_p95": _p(self._idle_share, 0.95),
            "idle_kv_share_protected": _mean(self._protected_share),
            "idle_kv_share_protected_p95": _p(self._protected_share, 0.95),
            "protected_kv_share": _mean(self._marked_share),
            "fleet_kv_used": _mean(self._used_share),
            "actions": dict(sorted(self.counts.items())),
        }
        if self.lost_sessions:  # an instance failure took sessions' GPU KV
            out["after_failure"] = {
                "sessions": self.lost_sessions,
                "resumed_turns": len(self.after_failure),
                "reuse_ratio": _reuse(self.after_failure),
            }
        return out


def _reuse(resumes: Sequence[Resume]) -> float | None:
    """The share of the resumed turns' reusable prefix blocks still cached (GPU or tier)."""
    reusable = sum(r.reusable for r in resumes)
    cached = sum(min(r.cached, r.reusable) for r in resumes)
    return round(cached / reusable, 4) if reusable else None


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _mean(xs: Sequence[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def _p(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 4)
