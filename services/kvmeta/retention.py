"""kvmeta's retention controller (thin shell over
:func:`~services.common.sessions.controller.plan_engines`).

It runs in kvmeta because kvmeta holds what the rule reads: the sessions (phase, home,
predicted return) and, beside them, each session's block-hash chain. On every tick
(``retention_tick_s``) it asks each engine that homes an idle or ended session (or was told
something last tick) for its KV capacity, plans, and, in ``enforce`` mode, tells it which
blocks to protect and which to offload (``POST /tideserve/retention``, the engine
simulator's route: :mod:`services.engine.retention_route`). In ``observe`` mode it plans and
counts but tells no engine: real engines (vLLM, SGLang) expose no API to pin or offload
chosen blocks, so there the plan is observed only (docs/agent-memory.md).

Where a session's prefix is goes into its placement (``tiers``): GPU while protected,
CPU once offloaded from an engine with the tier (it stores what it evicts, or wrote it
through already; else nowhere). A session the rule keeps on the GPU past the budget (evictable
cache) may be evicted by its engine on demand, to the tier when it offloads on eviction: with
``locate`` (kvmeta's index, from the engine's KV events, and the tier's objects), an idle
session whose leading blocks are no longer all on its home's GPU while the tier holds more of
them is recorded on CPU
(:func:`~services.common.sessions.prefetching.evicted_to_tier`; ``evicted_sessions``), so
prefetch covers it like one the controller offloaded. An engine's URL comes from ``urls``
(:mod:`services.kvmeta.engine_urls`: configured, then learnt from membership events), else
``http://<instance>`` for an instance id of the form host:port; an engine with neither is
skipped and counted (``unknown_engine``). One engine's failure never
stops the others; every outcome is counted in ``stats``.

Prefetch (``prefetch``, on by default): each tick, for idle sessions whose prefix is
offloaded, :func:`~services.common.sessions.prefetching.due_prefetches` (the engine's
profile, block size and tier from its ``GET``) says which to bring back now; ``enforce``
sends them in the same ``POST`` (``prefetch`` jobs) to the session's home, the engine that
serves its next turn. The engines' job reports (``prefetches`` on the next ``GET``) settle
them (:func:`~services.common.sessions.prefetching.settle`): finished, failed, late (the
turn came first), used, expired; a session being prefetched stays protected and out of the
offload list until its turn arrives, and once its prefix is back its placement records it
on the GPU. ``observe`` counts the prefetches it would start (``prefetch_planned``) and
tells no engine. Times: the engine's model is in modelled milliseconds; an engine run with
a speedup fetches faster in wall time than planned, so the lead is generous, not short.

An engine that was told marks and stops answering after its sessions left it (it was
removed) is dropped from the engines asked, after one counted error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import aiohttp

from services.common.kvindex.events import TIERS
from services.common.perfmodel import get_profile
from services.common.sessions import Session, SessionKey
from services.common.sessions.controller import EngineKV, EngineRetention, plan_engines
from services.common.sessions.prefetching import (
    Due,
    EngineLink,
    Settled,
    Tracked,
    due_prefetches,
    evicted_to_tier,
    may_be_evicted,
    offloaded,
    settle,
    started,
)
from services.kvmeta.engine_urls import engine_url
from services.kvmeta.rebalance import Rebalancer
from services.kvmeta.sessions import SessionShell

__all__ = ["PATH", "Locate", "RetentionController", "evicted_placements"]

PATH = "/tideserve/retention"
GPU, CPU = TIERS[0], TIERS[1]

log = logging.getLogger(__name__)

# (session, its chain) -> (leading blocks on its home's GPU, leading blocks on the tier)
Locate = Callable[[Session, Sequence[int]], tuple[int, int]]


class RetentionController:
    def __init__(
        self,
        sessions: SessionShell,
        *,
        mode: str = "observe",
        budget_share: float = 0.2,
        keep_unprotected: bool = True,
        urls: Mapping[str, str] | None = None,
        timeout_s: float = 2.0,
        wall: Callable[[], float] | None = None,
        prefetch: bool = True,
        tick_s: float = 1.0,
        prefetch_margin_ratio: float = 0.2,
        prefetch_margin_s: float = 0.5,
        locate: Locate | None = None,
        rebalance: Rebalancer | None = None,
    ) -> None:
        """``locate``: where a session's prefix is, from kvmeta's index and the tier's
        objects (:func:`~services.kvmeta.fetchable.on_gpu_and_tier`); with it, sessions the
        engine evicted on demand are recorded on the tier (module doc). ``rebalance``:
        hot-spot rebalancing (:mod:`services.kvmeta.rebalance`), planned every tick and
        told to the engines in ``enforce`` mode."""
        if mode not in ("observe", "enforce"):
            raise ValueError(f"retention mode must be observe or enforce, got {mode!r}")
        self.sessions = sessions
        self.mode = mode
        self.budget_share = budget_share
        self.keep_unprotected = keep_unprotected
        self.urls: Mapping[str, str] = urls if urls is not None else {}  # read at each tick
        self.timeout_s = timeout_s
        self.wall = wall or sessions.now
        self._told: set[str] = set()  # engines given marks last tick (cleared when none left)
        self.prefetch = prefetch
        self.tick_s = tick_s
        self.margins = (prefetch_margin_ratio, prefetch_margin_s)
        self.locate = locate
        self.rebalance = rebalance
        self.prefetches: dict[SessionKey, Tracked] = {}  # started, until the turn arrives
        self._http: aiohttp.ClientSession | None = None
        self.stats: dict[str, int] = {
            "ticks": 0,
            "plans": 0,
            "applied": 0,
            "errors": 0,
            "unknown_engine": 0,
            "protected_sessions": 0,
            "offloaded_sessions": 0,
            "protected_blocks": 0,
            "offloaded_blocks": 0,
            "evicted_sessions": 0,  # kept on the GPU, evicted on demand to the tier: recorded
            # prefetch: planned (observe: would start), started (an engine accepted),
            # finished, failed, late (the turn came first), used, expired (module doc)
            "prefetch_planned": 0,
            "prefetch_started": 0,
            "prefetch_finished": 0,
            "prefetch_failed": 0,
            "prefetch_late": 0,
            "prefetch_used": 0,
            "prefetch_expired": 0,
            # hot-spot rebalancing: sessions the rule moved (observe: would move)
            "rebalanced_sessions": 0,
        }

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def tick(self) -> dict[str, EngineRetention]:
        """One round: capacities, plans, prefetches and (enforce) the engines told; returns
        the plans."""
        self.stats["ticks"] += 1
        rows = self.sessions.table.rows()
        homes = {s.home_instance for s in rows if s.home_instance}  # active ones: held
        homes |= {t.instance for t in self.prefetches.values()}
        targets = self._targets(homes | self._told)
        if not targets:
            return {}
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        infos_by = dict(
            zip(
                targets,
                await asyncio.gather(*(self._get(u) for u in targets.values())),
                strict=True,
            )
        )
        for iid, info in infos_by.items():
            if info is None and iid not in homes:
                self._told.discard(iid)  # removed with the sessions it held: stop asking
        kv = {iid: EngineKV(int(info["capacity_blocks"])) for iid, info in infos_by.items() if info}
        now = self.wall()
        self._settle(settle(self.prefetches, {s.key: s for s in rows}, _reports(infos_by), now))
        hold = {k for k, t in self.prefetches.items() if t.held}
        chains = self.sessions.chains
        plans = plan_engines(
            rows, chains, kv, now, budget_share=self.budget_share, hold=hold,
            keep_unprotected=self.keep_unprotected,
        )  # fmt: skip
        self.stats["plans"] += len(plans)
        for p in plans.values():
            self.stats["protected_sessions"] += len(p.plan.protected)
            self.stats["offloaded_sessions"] += len(p.plan.offload)
            self.stats["protected_blocks"] += len(p.protect)
            self.stats["offloaded_blocks"] += len(p.offload)
        due = self._due(rows, infos_by, now)
        moves = self.rebalance.plan(rows, chains, infos_by, now) if self.rebalance else []
        self.stats["rebalanced_sessions"] += len(moves)
        if self.mode == "enforce":
            Rebalancer.apply(moves, plans, rows, chains)
            turns = {s.key: s.turns for s in rows}
            await asyncio.gather(
                *(
                    self._post(iid, targets[iid], p, [d for d in due if d.instance == iid], turns)
                    for iid, p in plans.items()
                )
            )
        self._place(rows, plans, infos_by=infos_by)
        if self.mode == "enforce":
            for mv in moves:  # re-homed, its prefix on the tier until the fetch lands
                n = len(chains.get(mv.key, ()))
                self.sessions.table.set_placement(
                    mv.key, now, home_instance=mv.destination, tiers={CPU: n}
                )
        self._place_evicted()
        try:
            await self.sessions.persist()
        except Exception:  # the session tick persists what is pending
            log.exception("retention: persisting placements failed")
        return plans

    def _targets(self, instances: set[str]) -> dict[str, str]:
        """The URLs of the engines to ask (those without one are counted)."""
        targets: dict[str, str] = {}
        for iid in sorted(instances):
            url = engine_url(iid, self.urls)
            if url is None:
                self.stats["unknown_engine"] += 1
            else:
                targets[iid] = url
        return targets

    def _settle(self, got: Settled) -> None:
        self.prefetches = got.tracked
        for name, items in (
            ("finished", got.finished),
            ("failed", got.failed),
            ("late", got.late),
            ("used", got.used),
            ("expired", got.expired),
        ):
            self.stats[f"prefetch_{name}"] += len(items)

    def _due(
        self, rows: list[Session], infos_by: Mapping[str, dict[str, Any] | None], now: float
    ) -> list[Due]:
        """The prefetches to start this tick (none when prefetch is off)."""
        if not self.prefetch:
            return []
        links: dict[str, EngineLink] = {}
        for iid, info in infos_by.items():
            try:
                if info is not None:
                    profile = get_profile(str(info["profile"]))
                    links[iid] = EngineLink(
                        profile, int(info["block_size"]), bool(info.get("kvcache_tier"))
                    )
            except (KeyError, TypeError, ValueError):  # an engine without them: no prefetch
                continue
        ratio, margin = self.margins
        due = due_prefetches(
            rows, self.sessions.chains, links, self.prefetches, now,
            tick_s=self.tick_s, margin_ratio=ratio, margin_s=margin,
        )  # fmt: skip
        self.stats["prefetch_planned"] += len(due)
        return due

    def _place_evicted(self) -> None:
        """Record on the tier the idle sessions whose blocks their home engine evicted on
        demand (enforce mode, with ``locate``; sessions being prefetched are left alone)."""
        if self.mode != "enforce" or self.locate is None:
            return
        now = self.wall()
        rows = self.sessions.table.rows()  # as placed this tick
        min_idle_s = 2.0 * self.tick_s  # the index has seen the last turn's blocks by then
        for key, tiers in evicted_placements(
            rows, self.sessions.chains, self.prefetches, self.locate, now, min_idle_s
        ):
            self.stats["evicted_sessions"] += 1
            self.sessions.table.set_placement(key, now, home_instance="", tiers=tiers)

    async def _get(self, url: str) -> dict[str, Any] | None:
        assert self._http is not None
        try:
            async with self._http.get(url + PATH) as r:
                if r.status != 200:
                    raise aiohttp.ClientError(f"HTTP {r.status}")
                body = await r.json()
                return body if isinstance(body, dict) and "capacity_blocks" in body else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            self.stats["errors"] += 1
            log.debug("retention: %s unreachable: %s", url, e)
            return None

    async def _post(
        self,
        iid: str,
        url: str,
        p: EngineRetention,
        due: list[Due],
        turns: Mapping[SessionKey, int],
    ) -> None:
        assert self._http is not None
        body = {
            "unprotect": "all",
            "protect": list(p.protect),
            "offload": list(p.offload),
            "prefetch": [
                {"id": d.job_id, "hashes": list(d.hashes), "tenant": d.tenant} for d in due
            ],
        }
        try:
            async with self._http.post(url + PATH, json=body) as r:
                if r.status != 200:
                    raise aiohttp.ClientError(f"HTTP {r.status}")
        except (aiohttp.ClientError, TimeoutError) as e:
            self.stats["errors"] += 1
            log.debug("retention: telling %s failed: %s", iid, e)
            return
        self.stats["applied"] += 1
        now = self.wall()
        for d in due:  # the engine runs them (an id it knows already is not restarted)
            self.prefetches[d.key] = started(d, turns.get(d.key, 0), now)
        self.stats["prefetch_started"] += len(due)
        if p.protect:
            self._told.add(iid)
        else:
            self._told.discard(iid)

    def _place(
        self,
        rows: list[Session],
        plans: Mapping[str, EngineRetention],
        infos_by: Mapping[str, dict[str, Any] | None],
    ) -> None:
        """Record where each planned session's prefix now is (observe mode: where it would
        be); placements that did not change are not rewritten."""
        if self.mode != "enforce":
            return
        by_key = {s.key: s for s in rows}
        now = self.wall()
        for iid, p in plans.items():
            info = infos_by.get(iid) or {}
            # offload on eviction stores what it evicts; write-through stored it already
            to_tier = bool(info.get("offloads_to_tier") or info.get("kvcache_tier"))
            moves: list[tuple[Session, dict[int, int]]] = []
            for keys, tier in ((p.plan.protected, GPU), (p.plan.offload, CPU)):
                for key in keys:
                    s = by_key.get(key)  # type: ignore[call-overload]
                    if s is None:
                        continue
                    if tier == GPU and offloaded(s):
                        continue  # marks keep resident blocks only: it stays on the tier
                    n = len(self.sessions.chains.get(s.key, ()))
                    moves.append((s, {tier: n} if tier == GPU or to_tier else {}))
            for s, tiers in moves:
                if dict(s.tiers) != tiers:
                    self.sessions.table.set_placement(
                        s.key, now, home_instance=s.home_instance, tiers=tiers
                    )
        for key, t in self.prefetches.items():  # prefixes back on their engine
            s = by_key.get(key)
            if t.done and s is not None and dict(s.tiers) != {GPU: t.blocks}:
                self.sessions.table.set_placement(
                    key, now, home_instance=s.home_instance, tiers={GPU: t.blocks}
                )


def evicted_placements(
    rows: list[Session],
    chains: Mapping[SessionKey, Sequence[int]],
    skip: Collection[SessionKey],
    locate: Locate,
    now: float,
    min_idle_s: float,
) -> list[tuple[SessionKey, dict[int, int]]]:
    """The sessions to record on the tier (kept, then evicted on demand: module doc)."""
    out: list[tuple[SessionKey, dict[int, int]]] = []
    for s in rows:
        chain = chains.get(s.key)
        if not chain or not s.home_instance or s.key in skip:
            continue
        if not may_be_evicted(s, now, min_idle_s):
            continue
        gpu, tier = locate(s, chain)
        tiers = evicted_to_tier(s, len(chain), gpu, tier, now, min_idle_s)
        if tiers is not None:
            out.append((s.key, tiers))
    return out


def _reports(
    infos_by: Mapping[str, dict[str, Any] | None],
) -> dict[str, dict[str, str] | None]:
    """Per engine asked, its prefetch jobs' states by id (None: it did not answer)."""
    out: dict[str, dict[str, str] | None] = {}
    for iid, info in infos_by.items():
        jobs = info.get("prefetches") if info is not None else None
        if not isinstance(jobs, dict):
            out[iid] = None if info is None else {}
            continue
        out[iid] = {str(k): str(v.get("state", "")) for k, v in jobs.items() if isinstance(v, dict)}
    return out
