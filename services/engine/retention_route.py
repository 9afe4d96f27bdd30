"""The engine simulator's retention admin route: the retention controller (kvmeta) tells it
which idle sessions' blocks to evict last and which to offload now.

``POST /tideserve/retention`` with a JSON object:

- ``protect``: block hashes to evict last (:meth:`~services.common.engine_core.kvcache.KVCache.protect`;
  only those resident are marked);
- ``unprotect``: hashes whose mark is dropped, or ``"all"``: every mark is dropped first
  (the controller sends ``"all"`` with the full protect list each tick, so a session no
  longer protected loses its marks);
- ``offload``: hashes to evict now, in that order (those resident and not in use): to the
  KV-cache tier when the engine offloads on eviction (``--kvcache-tier``), else freed.

- ``prefetch``: jobs ``{"id": str, "hashes": [int], "tenant": str}``: bring each chain
  (parent first) back from the KV-cache tier ahead of its session's next turn, in the
  background (:mod:`services.engine.prefetch`); the blocks become resident and protected,
  and the KV events announce them. An id already pending or done is not started again.

Order: ``unprotect``, ``protect``, ``offload``, ``prefetch`` (a hash both protected and
offloaded is offloaded). The answer, also of ``GET``: the cache's ``capacity_blocks``,
``used_blocks``, ``free_blocks``, ``protected_blocks``, ``offloads_to_tier``,
``offload_pending`` (evicted blocks whose store to the tier has not finished yet: a caller
about to stop the engine waits for 0), the performance ``profile``, ``block_size`` and
whether it has a ``kvcache_tier`` (what a caller needs to weigh fetching against
recomputing), ``prefetch_pending`` (blocks of prefetch jobs not finished) and
``prefetches`` (per job id: ``state`` pending, done or failed, ``blocks``, ``resident``,
``fetched``, ``error``) and, for a POST, how many were ``marked`` and ``offloaded`` and how
many prefetches ``prefetch_started``. A body that is not such an object is a 400.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from services.common.engine_core.core import EngineCore
from services.engine.prefetch import Prefetcher, parse_jobs
from services.engine.settings import EngineSettings
from services.engine.tier_io import TierIO

__all__ = ["PATH", "RetentionRoute"]

PATH = "/tideserve/retention"


class RetentionEngine(Protocol):
    core: EngineCore
    tier_io: TierIO | None
    prefetcher: Prefetcher
    settings: EngineSettings


def _hashes(body: dict[str, Any], key: str) -> list[int]:
    v = body.get(key, [])
    if not isinstance(v, list) or not all(isinstance(h, int) and h >= 0 for h in v):
        raise ValueError(f"'{key}' must be a list of block hashes (integers >= 0)")
    return [int(h) for h in v]


class RetentionRoute:
    def __init__(self, engine: RetentionEngine) -> None:
        self._e = engine

    def add_to(self, r: web.UrlDispatcher) -> None:
        r.add_post(PATH, self.handle)
        r.add_get(PATH, self.handle)

    async def handle(self, req: web.Request) -> web.Response:
        cache = self._e.core.cache
        done: dict[str, int] = {}
        if req.method == "POST":
            try:
                body = await req.json()
                if not isinstance(body, dict):
                    raise ValueError("body must be an object")
                protect, offload = _hashes(body, "protect"), _hashes(body, "offload")
                drop = body.get("unprotect", [])
                drop_all = drop == "all"
                unprotect = [] if drop_all else _hashes(body, "unprotect")
                jobs = parse_jobs(body)
            except (ValueError, TypeError) as err:
                return web.json_response(
                    {"error": {"message": str(err), "type": "invalid_request_error"}},
                    status=400,
                )
            cache.unprotect(None if drop_all else unprotect)
            done["marked"] = cache.protect(protect)
            done["offloaded"] = cache.evict_now(offload)
            if self._e.tier_io is not None:  # their bytes go to the tier now
                self._e.tier_io.evicted(cache.drain_evicted())
            done["prefetch_started"] = self._e.prefetcher.start(jobs)
        pf = self._e.prefetcher
        return web.json_response(
            {
                "capacity_blocks": cache.capacity_blocks,
                "used_blocks": cache.used_blocks,
                "free_blocks": cache.free_blocks,
                "protected_blocks": cache.protected_blocks,
                "offloads_to_tier": cache.hold_evicted,
                "offload_pending": cache.held_slots,
                "profile": self._e.settings.profile,
                "block_size": cache.block_size,
                "kvcache_tier": self._e.tier_io is not None,
                "prefetch_pending": pf.pending_blocks,
                "prefetches": pf.report(),
                **done,
            }
        )
