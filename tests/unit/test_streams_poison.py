"""The poison-entry rule (services/common/streams/poison.py): table-driven."""

from __future__ import annotations

import psycopg
import pytest
import redis.exceptions as redis_exc
import sqlalchemy.exc as sa_exc

from services.common.streams.poison import (
    Verdict,
    failure_verdict,
    is_transient,
    overdelivered,
)


@pytest.mark.parametrize(
    ("delivered", "max_attempts", "transient", "verdict"),
    [
        (1, 5, False, Verdict.PENDING),
        (4, 5, False, Verdict.PENDING),
        (5, 5, False, Verdict.DEAD),
        (9, 5, False, Verdict.DEAD),
        (1, 1, False, Verdict.DEAD),
        (1, 5, True, Verdict.HOLD),
        (50, 5, True, Verdict.HOLD),
    ],
    ids=[
        "first-fault",
        "one-attempt-left",
        "last-attempt",
        "beyond",
        "single-attempt",
        "transient",
        "transient-never-counts",
    ],
)
def test_failure_verdict(
    delivered: int, max_attempts: int, transient: bool, verdict: Verdict
) -> None:
    assert failure_verdict(delivered, max_attempts, transient) is verdict


def test_failure_verdict_rejects_zero_attempts() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        failure_verdict(1, 0, False)


@pytest.mark.parametrize(
    ("delivered", "max_attempts", "over"),
    [(1, 5, False), (5, 5, False), (6, 5, True), (2, 1, True)],
    ids=["fresh", "at-limit-still-handled", "crash-loop", "single-attempt-redelivered"],
)
def test_overdelivered(delivered: int, max_attempts: int, over: bool) -> None:
    assert overdelivered(delivered, max_attempts) is over


def _invalidated() -> sa_exc.DBAPIError:
    return sa_exc.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True)


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (redis_exc.ConnectionError("refused"), True),
        (redis_exc.TimeoutError("slow"), True),
        (redis_exc.BusyLoadingError("loading"), True),
        (ConnectionRefusedError(111, "refused"), True),
        (TimeoutError(), True),
        (sa_exc.OperationalError("SELECT 1", {}, Exception("server closed")), True),
        (sa_exc.TimeoutError("pool"), True),
        (_invalidated(), True),
        (psycopg.OperationalError("connection refused"), True),
        (psycopg.errors.AdminShutdown(), True),
        (psycopg.DataError("NUL byte"), False),
        (sa_exc.IntegrityError("INSERT", {}, Exception("duplicate")), False),
        (sa_exc.DataError("INSERT", {}, Exception("out of range")), False),
        (redis_exc.ResponseError("WRONGTYPE"), False),
        (ValueError("bad record"), False),
        (KeyError("x"), False),
    ],
    ids=[
        "redis-down",
        "redis-timeout",
        "redis-loading",
        "socket-refused",
        "timeout",
        "pg-down",
        "pg-pool",
        "pg-invalidated",
        "psycopg-down",
        "psycopg-shutdown",
        "psycopg-data",
        "pg-integrity",
        "pg-data",
        "redis-wrongtype",
        "value-error",
        "key-error",
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient
