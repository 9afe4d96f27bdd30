"""Session migration on scale-in (thin shell over
:func:`~services.common.sessions.migration.plan_migration`): ``MigrateSessions``.

The autoscaler calls it for an instance it has drained and is about to remove, naming the
instances that stay. kvmeta then:

1. takes the sessions homed on the victim (every tenant's) and the size of each one's
   prefix there (its chain's length when kvmeta holds its chain, else its placement);
2. asks each destination engine for its free KV blocks (``GET /tideserve/retention``; an
   engine that does not answer has no room) and plans;
3. tells the victim engine to offload the chains of the sessions that move or go to the
   tier (``POST /tideserve/retention`` ``offload``), warmest session first and each chain
   parent first, so that a store cut short by the removal still leaves a leading run of the
   prefix in the tier, which is what a fetch uses; then waits, at most ``offload_wait_s``,
   until the engine reports no offloaded block still waiting for its store
   (``offload_pending`` 0: ``offload_settled``), since the instance is removed right after
   the reply. No engine pushes blocks to another: a moved session's blocks reach its
   destination through the tier, fetched when its next turn arrives there (the engine's
   fetch-or-recompute);
4. records each live session's new placement (the caller persists it): its home becomes the instance the router
   will send its next turn to (its rendezvous home among the destinations, which is the
   plan's destination for a move), its tiers the CPU tier when the victim offloads to the
   tier and was told, else nothing. Ended sessions are left to expire.

Real engines (vLLM, SGLang) have no offload route: they are only re-homed, and the engine
detail says why the blocks were not offloaded. Stores not done when the wait ends are lost
when the instance is removed (the tier is a cache: those blocks are recomputed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from services.common.kvindex.events import TIERS
from services.common.sessions import Phase, Session
from services.common.sessions.homes import rendezvous_home, route_key
from services.common.sessions.migration import (
    Destination,
    Fate,
    MigrationPlan,
    migrant,
    plan_migration,
)
from services.kvmeta.retention import PATH, engine_url
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


class SessionMigrator:
    def __init__(
        self,
        sessions: SessionShell,
        *,
        urls: Mapping[str, str] | None = None,
        timeout_s: float = 2.0,
        offload_wait_s: float = 10.0,
        poll_s: float = 0.1,
        wall: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions = sessions
        self.urls = dict(urls or {})
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

    async def _free(self, http: aiohttp.ClientSession, d: DestinationRef) -> int:
        url = self._url(d.instance_id, d.url)
        info = await self._call(http, url, None) if url else "no URL"
        return int(info.get("free_blocks", 0)) if isinstance(info, dict) else 0

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
        free = await asyncio.gather(*(self._free(http, d) for d in dests))
        destinations = [
            Destination(d.instance_id, n, d.load) for d, n in zip(dests, free, strict=True)
        ]
        plan = plan_migration([migrant(s, size[s.key]) for s in rows], destinations, self.wall())
        by_key = {s.key: s for s in rows}
        hashes: dict[int, None] = {}
        for mv in plan.moves:
            if mv.fate is not Fate.DROP:
                hashes.update(dict.fromkeys(chains.get(mv.key, ())))  # parent first
        result = MigrationResult(plan, by_key, offload_requested=len(hashes))
        if hashes:
            result = await self._offload(http, instance, url, list(hashes), result)
        self._place(plan, by_key, [d.instance_id for d in dests], result)
        return result

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
