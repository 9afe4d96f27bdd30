"""Session migration on scale-in (thin shell over
:func:`~services.common.sessions.migration.plan_migration`): ``MigrateSessions``.

The autoscaler calls it for an instance it has drained and is about to remove, naming the
instances that stay. kvmeta then:

1. takes the sessions homed on the victim (every tenant's) and the size of each one's
   prefix there (its chain's length when kvmeta holds its chain, else its placement);
2. asks each destination engine for its free KV blocks and whether it has a KV-cache tier
   (``GET /tideserve/retention``; an engine that does not answer has no room) and plans.
   With ``placement="kv_spread"`` (the default) a destination's load is the KV of the
   *active* sessions already homed there
   (:func:`~services.common.sessions.migration.active_kv`), so the victim's sessions spread
   over the instances by the KV they bring back; ``"rendezvous"`` sends each to its
   rendezvous home among the destinations (the tier when that home lacks room);
3. tells the victim engine to offload the chains of the sessions that move or go to the
   tier (``POST /tideserve/retention`` ``offload``), warmest session first and each chain
   parent first, so that a store cut short by the removal still leaves a leading run of the
   prefix in the tier, which is what a fetch uses; then waits, at most ``offload_wait_s``,
   until the engine reports no offloaded block still waiting for its store
   (``offload_pending`` 0: ``offload_settled``), since the instance is removed right after
   the reply. No engine pushes blocks to another: a moved session's blocks reach its
   destination through the tier;
4. with ``prefetch`` (default) and the victim's blocks in the tier, asks each move's
   destination that has a tier to fetch the moved sessions' chains now (``prefetch`` jobs,
   one per session and turn, the id the retention controller uses, so neither starts it
   twice). The fetched blocks are announced by the destination's KV events, which is how
   the gateways learn that the session's prefix is there and route its next turn to it.
   Without a prefetch the next turn fetches what it finds in the tier at admission;
5. records each live session's new placement (the caller persists it): its home becomes
   the instance its next turn should be served by (the plan's destination for a move, else
   its rendezvous home among the destinations), its tiers the CPU tier when the victim
   offloads to the tier and was told, else nothing. Ended sessions are left to expire.

Real engines (vLLM, SGLang) have no offload route: they are only re-homed, and the engine
detail says why the blocks were not offloaded. Stores not done when the wait ends are lost
when the instance is removed (the tier is a cache: those blocks are recomputed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from services.common.kvindex.events import TIERS
from services.common.sessions import Phase, Session
from services.common.sessions.homes import rendezvous_home, route_key
from services.common.sessions.migration import (
    Destination,
    Fate,
    MigrationPlan,
    Placement,
    active_kv,
    migrant,
    plan_migration,
)
from services.common.sessions.prefetching import job_id
from services.kvmeta.engine_urls import engine_url
from services.kvmeta.retention import PATH
from services.kvmeta.sessions import SessionShell

__all__ = ["DestinationRef", "MigrationResult", "SessionMigrator"]

CPU = TIERS[1]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DestinationRef:
    instance_id: str
    url: str = ""  # "" = kvmeta's mapping (engine_url)
    load: float = 0.0


@dataclass(frozen=True, slots=True)
class MigrationResult:
    plan: MigrationPlan
    sessions: Mapping[tuple[str, str, str], Session]  # the victim's sessions, by key
    offload_requested: int = 0
    offloaded: int = 0
    offloads_to_tier: bool = False
    engine_detail: str = ""
    offload_settled: bool = False
    prefetch_started: int = 0  # sessions whose destination accepted a prefetch of its chain


@dataclass(frozen=True, slots=True)
class _Dest:
    """A destination as its engine answered: free blocks and whether it has a tier."""

    ref: DestinationRef
    url: str | None
    free_blocks: int = 0
    has_tier: bool = False


class SessionMigrator:
    def __init__(
        self,
        sessions: SessionShell,
        *,
        urls: Mapping[str, str] | None = None,
        timeout_s: float = 2.0,
        offload_wait_s: float = 10.0,
        poll_s: float = 0.1,
        placement: Placement = "kv_spread",
        active_window_s: float = 300.0,
        prefetch: bool = True,
        wall: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions = sessions
        self.placement: Placement = placement
        self.active_window_s = active_window_s
        self.prefetch = prefetch
        self.urls: Mapping[str, str] = urls if urls is not None else {}  # read per migration
        self.timeout_s = timeout_s
        self.offload_wait_s = offload_wait_s
        self.poll_s = poll_s
        self._clock = clock
        self.wall = wall or sessions.now

    def _url(self, instance: str, given: str) -> str | None:
        return given.rstrip("/") if given else engine_url(instance, self.urls)

    async def _call(
        self, http: aiohttp.ClientSession, url: str, body: dict[str, Any] | None
    ) -> dict[str, Any] | str:
        """The retention route's answer, or why there is none."""
        try:
            req = http.post(url + PATH, json=body) if body is not None else http.get(url + PATH)
            async with req as r:
                if r.status != 200:
                    return f"HTTP {r.status} from {url}{PATH}"
                got = await r.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return f"{url}{PATH}: {e or type(e).__name__}"
        return got if isinstance(got, dict) else f"{url}{PATH}: not an object"

    async def _dest(self, http: aiohttp.ClientSession, d: DestinationRef) -> _Dest:
        url = self._url(d.instance_id, d.url)
        info = await self._call(http, url, None) if url else "no URL"
        if not isinstance(info, dict):
            return _Dest(d, url)
        return _Dest(d, url, int(info.get("free_blocks", 0)), bool(info.get("kvcache_tier")))

    def _loads(self, deployment: str, dests: Sequence[_Dest]) -> list[float]:
        """Each destination's load as the placement weighs it (module doc, step 2)."""
        if self.placement != "kv_spread":
            return [d.ref.load for d in dests]
        rows = [s for s in self.sessions.table.rows() if s.deployment == deployment]
        blocks = {s.key: len(c) for s in rows if (c := self.sessions.chains.get(s.key))}
        ids = [d.ref.instance_id for d in dests]
        kv = active_kv(rows, blocks, ids, self.wall(), self.active_window_s)
        return [float(kv[i]) for i in ids]

    async def migrate(
        self, deployment: str, instance: str, url: str, dests: Sequence[DestinationRef]
    ) -> MigrationResult:
        """Plan, offload and re-home the sessions homed on ``instance`` (module doc). One
        HTTP client per call: a migration happens once per scale-in."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            return await self._migrate(http, deployment, instance, url, dests)

    async def _migrate(
        self,
        http: aiohttp.ClientSession,
        deployment: str,
        instance: str,
        url: str,
        dests: Sequence[DestinationRef],
    ) -> MigrationResult:
        rows = [
            s
            for s in self.sessions.table.rows()
            if s.deployment == deployment and s.home_instance == instance
        ]
        chains = self.sessions.chains
        size = {s.key: len(chains[s.key]) if s.key in chains else s.blocks for s in rows}
        found = await asyncio.gather(*(self._dest(http, d) for d in dests))
        destinations = [
            Destination(d.ref.instance_id, d.free_blocks, load)
            for d, load in zip(found, self._loads(deployment, found), strict=True)
        ]
        plan = plan_migration(
            [migrant(s, size[s.key]) for s in rows],
            destinations,
            self.wall(),
            placement=self.placement,
        )
        by_key = {s.key: s for s in rows}
        hashes: dict[int, None] = {}
        for mv in plan.moves:
            if mv.fate is not Fate.DROP:
                hashes.update(dict.fromkeys(chains.get(mv.key, ())))  # parent first
        result = MigrationResult(plan, by_key, offload_requested=len(hashes))
        if hashes:
            result = await self._offload(http, instance, url, list(hashes), result)
        if self.prefetch and result.offloads_to_tier and not result.engine_detail:
            result = await self._prefetch(http, plan, by_key, found, result)
        self._place(plan, by_key, [d.instance_id for d in dests], result)
        return result

    async def _prefetch(
        self,
        http: aiohttp.ClientSession,
        plan: MigrationPlan,
        by_key: Mapping[tuple[str, str, str], Session],
        dests: Sequence[_Dest],
        result: MigrationResult,
    ) -> MigrationResult:
        """Ask each move's destination with a tier to fetch the moved chains (module doc,
        step 4); how many sessions' prefetches were accepted."""
        jobs: dict[str, list[dict[str, Any]]] = {}
        for mv in plan.of(Fate.MOVE):
            s, chain = by_key[mv.key], self.sessions.chains.get(mv.key)
            if s.phase is not Phase.ENDED and chain:
                job = {"id": job_id(s), "hashes": list(chain), "tenant": s.tenant}
                jobs.setdefault(mv.instance, []).append(job)
        started = 0
        for d in dests:
            todo = jobs.get(d.ref.instance_id)
            if not todo or not d.has_tier or not d.url:
                continue
            got = await self._call(http, d.url, {"prefetch": todo})
            if isinstance(got, str):
                log.warning("migrate: %s not told to prefetch: %s", d.ref.instance_id, got)
                continue
            started += len(todo)
        return replace(result, prefetch_started=started)

    async def _offload(
        self,
        http: aiohttp.ClientSession,
        instance: str,
        url: str,
        hashes: list[int],
        result: MigrationResult,
    ) -> MigrationResult:
        target = self._url(instance, url) or ""
        got = await self._call(http, target, {"offload": hashes}) if target else "no URL"
        if isinstance(got, str):
            log.warning("migrate: %s not told to offload: %s", instance, got)
            return MigrationResult(result.plan, result.sessions, len(hashes), engine_detail=got)
        to_tier = bool(got.get("offloads_to_tier"))
        settled = to_tier and await self._settled(http, target, got)
        return MigrationResult(
            result.plan,
            result.sessions,
            len(hashes),
            int(got.get("offloaded", 0)),
            to_tier,
            offload_settled=settled,
        )

    async def _settled(self, http: aiohttp.ClientSession, url: str, got: dict[str, Any]) -> bool:
        """Wait (at most ``offload_wait_s``) until the engine has no offloaded block
        waiting for its store; whether it got there."""
        deadline = self._clock() + self.offload_wait_s
        while int(got.get("offload_pending", 0)) > 0:
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(self.poll_s)
            answer = await self._call(http, url, None)
            if isinstance(answer, str):
                return False
            got = answer
        return True

    def _place(
        self,
        plan: MigrationPlan,
        by_key: Mapping[tuple[str, str, str], Session],
        dest_ids: Sequence[str],
        result: MigrationResult,
    ) -> None:
        """Every live session is re-homed where its next turn will be served (module doc)."""
        in_tier = result.offloads_to_tier and not result.engine_detail
        now = self.wall()
        for mv in plan.moves:
            s = by_key[mv.key]
            if s.phase is Phase.ENDED:
                continue
            home = mv.instance or rendezvous_home(
                route_key(s.session_id, s.parent_session_id), dest_ids
            )
            kept = in_tier and mv.fate is not Fate.DROP and mv.key in self.sessions.chains
            self.sessions.table.set_placement(
                s.key, now, home_instance=home or "", tiers={CPU: mv.blocks} if kept else {}
            )
