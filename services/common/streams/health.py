"""Reachability of the Redis that carries the streams."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from services.common.streams.codec import one_line

__all__ = ["check_redis", "close_quietly"]


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


async def check_redis(url: str, timeout_s: float = 5.0) -> None:
    """PING the Redis at ``url``; raises ``ConnectionError`` with a one-line message."""
    try:
        client = aioredis.Redis.from_url(
            url,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # one PING: the caller reports or retries
        )
    except (ValueError, RedisError) as exc:
        raise ConnectionError(f"redis_url {_redact(url)!r} is invalid: {one_line(exc)}") from None
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        raise ConnectionError(f"cannot reach Redis at {_redact(url)}: {one_line(exc)}") from None
    finally:
        await client.aclose()


async def close_quietly(client: aioredis.Redis | None) -> None:
    """Close a client at shutdown; a Redis that is already gone is not an error then."""
    if client is None:
        return
    try:
        await client.aclose()
    except (RedisError, OSError):
        pass
