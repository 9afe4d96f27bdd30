"""The gateway's in-process cache of API keys (so the hot path does not ask Postgres per
request).

Rule: an answer from the store (a key, or "no such key") is used for ``ttl_s`` after it
was fetched; so a revocation (or a new key tried before it existed) takes effect within
``ttl_s``. Concurrent misses for one key share one fetch. When the store fails, an answer
at most ``stale_s`` old is used (Postgres down: keys seen recently keep working, and a
revocation made meanwhile waits for Postgres); with none, :class:`KeysUnavailable`. At most
``max_entries`` answers are kept (expired ones are dropped first, then all).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from services.scheduler.keys.model import ApiKey

__all__ = ["KeyCache", "KeysUnavailable"]

log = logging.getLogger(__name__)

Fetch = Callable[[bytes], Awaitable[ApiKey | None]]


class KeysUnavailable(Exception):
    """The store failed and no recent enough answer is cached."""


class KeyCache:
    def __init__(
        self,
        fetch: Fetch,
        *,
        ttl_s: float = 5.0,
        stale_s: float = 300.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetch = fetch
        self.ttl_s = ttl_s
        self.stale_s = max(stale_s, ttl_s)
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[bytes, tuple[float, ApiKey | None]] = {}
        self._pending: dict[bytes, asyncio.Future[ApiKey | None]] = {}
        self.fetches = 0

    async def get(self, digest: bytes) -> ApiKey | None:
        """The key hashing to ``digest`` (revoked ones too) or None; see the rule."""
        hit = self._entries.get(digest)
        if hit is not None and self.clock() - hit[0] < self.ttl_s:
            return hit[1]
        pending = self._pending.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[ApiKey | None] = asyncio.get_running_loop().create_future()
        self._pending[digest] = fut
        try:
            key = await self._refresh(digest, hit)
        except KeysUnavailable as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: waiters get it; none is fine too
            raise
        finally:
            del self._pending[digest]
        fut.set_result(key)
        return key

    async def _refresh(
        self, digest: bytes, hit: tuple[float, ApiKey | None] | None
    ) -> ApiKey | None:
        self.fetches += 1
        try:
            key = await self.fetch(digest)
        except Exception as e:  # the store's failure, whatever the driver raises
            if hit is not None and self.clock() - hit[0] < self.stale_s:
                return hit[1]
            log.warning("API keys: the store failed (%s)", e)
            raise KeysUnavailable(str(e)) from None
        now = self.clock()
        if len(self._entries) >= self.max_entries:
            self._entries = {d: e for d, e in self._entries.items() if now - e[0] < self.ttl_s}
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
        self._entries[digest] = (now, key)
        return key
