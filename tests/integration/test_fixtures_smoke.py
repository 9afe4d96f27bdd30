"""The session fixtures reach real servers."""

from __future__ import annotations

from typing import Any

import psycopg


def test_postgres_url_answers(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_postgres_db_url_is_a_separate_empty_database(
    postgres_url: str, postgres_db_url: str
) -> None:
    with psycopg.connect(postgres_db_url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
    with psycopg.connect(postgres_url) as conn:
        base = conn.execute("SELECT current_database()").fetchone()
    assert name != base


async def test_redis_client_roundtrip(redis_client: Any) -> None:
    await redis_client.set("k", b"v")
    assert await redis_client.get("k") == b"v"


def test_pg_schema_reset_drops_a_migrated_schema(postgres_url: str, pg_schema_reset: Any) -> None:
    from services.common.db import current_revision, migrate

    migrate(postgres_url, "scheduler")
    assert current_revision(postgres_url, "scheduler") is not None
    pg_schema_reset("scheduler")
    assert current_revision(postgres_url, "scheduler") is None
