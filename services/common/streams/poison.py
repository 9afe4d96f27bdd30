"""Poison entries (pure): when a consumer group gives up on an entry.

Rule: a failure is either **transient** (the handler could not reach something it needs:
Redis, Postgres, the network; :func:`is_transient`) or a **fault** (the entry itself, or a
bug its content triggers). A transient failure never counts against the entry: the consumer
holds the entry and retries it in-process with back-off, without a new delivery, until the
dependency is back. A fault counts: the entry stays pending, is redelivered by reclaim
(XAUTOCLAIM, which increments the delivery count Redis keeps in the pending list), and once
it has been delivered ``max_attempts`` times and failed again it is copied to the
dead-letter stream with the reason and acknowledged. A reclaimed entry already delivered
more than ``max_attempts`` times (its consumer died while handling it, again and again:
a crash loop) is dead-lettered without being handled once more.

The delivery count lives in Redis (XPENDING), so it survives restarts and is shared by the
members of the group: an entry is handled at most ``max_attempts`` times in all.
"""

from __future__ import annotations

import enum

import psycopg
import redis.exceptions as redis_exc
import sqlalchemy.exc as sa_exc

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Verdict",
    "crash_loop_reason",
    "failure_reason",
    "failure_verdict",
    "is_transient",
    "overdelivered",
]

DEFAULT_MAX_ATTEMPTS = 5

_TRANSIENT: tuple[type[BaseException], ...] = (
    redis_exc.ConnectionError,  # includes BusyLoadingError
    redis_exc.TimeoutError,
    redis_exc.ReadOnlyError,  # a replica being promoted
    OSError,  # includes ConnectionError, TimeoutError (builtin and asyncio)
    sa_exc.OperationalError,  # connection refused/lost, server shutting down
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,  # connection pool exhausted
    psycopg.OperationalError,  # direct psycopg users: connection lost, server shut down
    psycopg.InterfaceError,
)


class Verdict(enum.Enum):
    """What a consumer does with an entry whose handler raised."""

    HOLD = "hold"  # transient: keep it, retry in-process after a back-off (not counted)
    PENDING = "pending"  # fault, attempts left: leave pending for reclaim (counted)
    DEAD = "dead"  # fault, out of attempts: dead-letter with the reason and acknowledge


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says a dependency was unreachable rather than the entry was bad.

    A SQLAlchemy error whose connection was invalidated counts as transient too."""
    if isinstance(exc, _TRANSIENT):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and bool(exc.connection_invalidated)


def failure_verdict(delivered: int, max_attempts: int, transient: bool) -> Verdict:
    """The verdict for an entry that failed on its ``delivered``-th delivery."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    if transient:
        return Verdict.HOLD
    return Verdict.DEAD if delivered >= max_attempts else Verdict.PENDING


def overdelivered(delivered: int, max_attempts: int) -> bool:
    """Whether a reclaimed entry was delivered more than ``max_attempts`` times (each
    earlier delivery ended without an ack or a verdict: its consumer died handling it)."""
    return delivered > max_attempts


def failure_reason(delivered: int, error: str) -> str:
    """The dead letter's reason for an entry given up after its handler failed."""
    return f"handler failed on delivery {delivered} (attempts exhausted): {error}"


def crash_loop_reason(delivered: int) -> str:
    """The dead letter's reason for an entry given up at reclaim (see :func:`overdelivered`)."""
    return (
        f"delivered {delivered} times and never acknowledged "
        "(its consumer died while handling it each time)"
    )
