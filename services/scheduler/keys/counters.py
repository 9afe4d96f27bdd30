"""Rate-limit counters: per tenant, per fixed window, requests and tokens.

:class:`RedisCounters` shares them across gateway replicas: one Lua script (:data:`ADD`,
one command, one round trip, atomic) adds the request to the current window's hash
``{prefix}:rl:{tenant}:{index}`` (fields ``r`` and ``t``, expiring after two windows) and
reads the previous window's. A refused request is taken back out (a second call, on
refusals only). A script rather than a MULTI/EXEC pipeline: one command to pack and one
reply to parse instead of six, which is most of the client's CPU per request. When Redis
fails, the counting falls back to this replica's own :class:`MemoryCounters` (limits then
hold per replica, not across them) until Redis answers again.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.scheduler.keys.ratelimit import WindowCounts

__all__ = ["ADD", "Counters", "MemoryCounters", "RedisCounters"]

ADD = """
local r = redis.call('HINCRBY', KEYS[1], 'r', ARGV[1])
local t = redis.call('HINCRBY', KEYS[1], 't', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local p = redis.call('HMGET', KEYS[2], 'r', 't')
return {tonumber(p[1]) or 0, r, tonumber(p[2]) or 0, t}
"""
"""KEYS: current window, previous window; ARGV: requests, tokens, TTL ms. Returns
(previous requests, current requests, previous tokens, current tokens)."""

log = logging.getLogger(__name__)


class Counters(Protocol):
    async def add(
        self, tenant: str, index: int, requests: int, tokens: int, window_ms: int
    ) -> WindowCounts:
        """Add to window ``index`` of ``tenant``; the counts after it (negative = take back)."""
        ...


class MemoryCounters:
    """This process's counters (tests, and the fallback while Redis is down)."""

    def __init__(self) -> None:
        self._w: dict[tuple[str, int], list[int]] = {}

    async def add(
        self, tenant: str, index: int, requests: int, tokens: int, window_ms: int
    ) -> WindowCounts:
        cur = self._w.setdefault((tenant, index), [0, 0])
        cur[0] += requests
        cur[1] += tokens
        prev = self._w.get((tenant, index - 1), [0, 0])
        if len(self._w) > 4096:  # drop windows that can no longer matter
            self._w = {k: v for k, v in self._w.items() if k[1] >= index - 1}
        return WindowCounts(prev[0], cur[0], prev[1], cur[1])


class RedisCounters:
    """Counters in Redis (see the module docstring); ``client`` should have a short
    ``socket_timeout`` so a hung Redis cannot hold requests."""

    def __init__(self, client: aioredis.Redis, prefix: str = "ts") -> None:
        self.client = client
        self.prefix = prefix
        self.fallback = MemoryCounters()
        self.failures = 0
        self._add = client.register_script(ADD)

    def _key(self, tenant: str, index: int) -> str:
        return f"{self.prefix}:rl:{tenant}:{index}"

    async def add(
        self, tenant: str, index: int, requests: int, tokens: int, window_ms: int
    ) -> WindowCounts:
        keys = [self._key(tenant, index), self._key(tenant, index - 1)]
        try:
            pr, r, pt, t = await self._add(keys=keys, args=[requests, tokens, 2 * window_ms])
        except (RedisError, OSError) as e:
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.warning("rate limits: Redis failed (%s); counting in this replica", e)
            return await self.fallback.add(tenant, index, requests, tokens, window_ms)
        return WindowCounts(int(pr), int(r), int(pt), int(t))
