"""The :class:`KeyGate` of a scheduler from its settings (``api_keys``), or None."""

from __future__ import annotations

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.common.errors import StartupError
from services.scheduler.keys.cache import KeyCache
from services.scheduler.keys.counters import Counters, MemoryCounters, RedisCounters
from services.scheduler.keys.gate import KeyGate
from services.scheduler.keys.store import KeyStore
from services.scheduler.settings import SchedulerSettings

__all__ = ["key_gate"]


def key_gate(
    settings: SchedulerSettings, registry: CollectorRegistry | None = None
) -> KeyGate | None:
    """The gate when ``api_keys`` is on (no I/O: connections open on first use), else None.
    StartupError when keys cannot work: no ``postgres_url``, or ``forward_authorization``
    (it would hand the clients' gateway keys to the engines)."""
    if not settings.api_keys:
        return None
    if not settings.postgres_url:
        raise StartupError("api_keys: needs postgres_url (the keys are stored there)")
    if settings.forward_authorization:
        raise StartupError(
            "api_keys with forward_authorization would send the clients' gateway keys to "
            "the engines; use engine_api_key instead"
        )
    store = KeyStore(settings.postgres_url)
    counters: Counters = MemoryCounters()
    client: aioredis.Redis | None = None
    if settings.redis_url:
        t = settings.rate_limit_redis_timeout_s
        # No retries: while Redis is down a request must fail over to this replica's own
        # counters within the timeout, not wait out redis-py's default back-off (seconds).
        client = aioredis.Redis.from_url(
            settings.redis_url,
            socket_timeout=t,
            socket_connect_timeout=t,
            retry=Retry(NoBackoff(), 0),
        )
        counters = RedisCounters(client, settings.stream_prefix)
    slo = sorted(settings.slo_classes, key=lambda c: -c.priority)
    gate = KeyGate(
        KeyCache(
            store.by_hash,
            ttl_s=settings.api_key_cache_ttl_s,
            stale_s=settings.api_key_stale_s,
        ),
        counters,
        classes=[c.name for c in slo],
        default_class=settings.default_slo_class,
        window_s=settings.rate_limit_window_s,
        lease_fraction=settings.rate_limit_lease_fraction,
        registry=registry,
    )
    gate.closers.append(store.close)
    if client is not None:
        gate.closers.append(client.aclose)
    return gate
