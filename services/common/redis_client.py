"""The one factory of the services' Redis clients: timeouts, health checks, retries.

Without timeouts a Redis that stops answering (a network cut, a paused or wedged server)
hangs every command forever; with them a command fails within ``socket_timeout_s`` with
``redis.exceptions.TimeoutError``, and the callers' retry loops take over (the stream
readers back off and retry, the producers report the failure).

- ``socket_timeout_s`` bounds each command's wait for a reply; it must exceed the longest
  blocking read (XREAD/XREADGROUP ``block_ms``, at most a few seconds here), which the
  settings check against :data:`MAX_BLOCK_MS`.
- ``connect_timeout_s`` bounds opening a connection.
- ``health_check_s``: a connection idle that long is PINGed before it is used again, so a
  connection the server (or a restart of it) dropped is replaced rather than failing a
  command.
- ``retries``: a command that failed with a connection error or a timeout is retried that
  many times (exponential back-off with jitter) on a new connection. This is safe for every
  command the services send: stream consumers are idempotent (an XADD repeated after a lost
  reply is applied once), and an XREADGROUP whose reply was lost leaves its entries pending,
  to be reclaimed. A caller that needs at most once passes ``retries=0``.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["MAX_BLOCK_MS", "RedisClientOptions", "redis_client"]

MAX_BLOCK_MS = 5_000
"""The longest blocking stream read the services issue; socket timeouts must exceed it."""


class RedisClientOptions(BaseModel):
    """Timeouts and retries of a service's Redis clients (settings key ``redis_client``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    socket_timeout_s: float = Field(
        default=10.0,
        gt=MAX_BLOCK_MS / 1000,
        description="a command's reply must come within this (exceeds every blocking read)",
    )
    connect_timeout_s: float = Field(default=5.0, gt=0.0, description="opening a connection")
    health_check_s: float = Field(
        default=15.0, ge=0.0, description="PING a connection idle this long before reuse; 0 = never"
    )
    retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description="retries of a command after a connection error or timeout",
    )
    backoff_base_s: float = Field(default=0.05, gt=0.0, description="first retry back-off")
    backoff_cap_s: float = Field(default=1.0, gt=0.0, description="longest retry back-off")


def redis_client(url: str, options: RedisClientOptions | None = None) -> aioredis.Redis:
    """An asyncio client on ``url`` (bytes responses, as the streams need) with the
    timeouts, health checks and retries of ``options`` (defaults when None)."""
    opts = options if options is not None else RedisClientOptions()
    retry = Retry(
        ExponentialWithJitterBackoff(base=opts.backoff_base_s, cap=opts.backoff_cap_s),
        opts.retries,
    )
    return aioredis.Redis.from_url(
        url,
        decode_responses=False,
        socket_timeout=opts.socket_timeout_s,
        socket_connect_timeout=opts.connect_timeout_s,
        socket_keepalive=True,
        health_check_interval=opts.health_check_s,
        retry=retry,
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
