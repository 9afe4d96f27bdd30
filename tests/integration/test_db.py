"""Database layer against a real Postgres: migrations, schemas, engines, health check."""

from __future__ import annotations

import importlib
import threading

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from services.common.db import (
    SERVICES,
    check_postgres,
    create_engine,
    current_revision,
    migrate,
    session_factory,
    to_async_url,
    to_libpq_url,
)
from services.scheduler.responses.store import PostgresResponseStore

# Tables at head; later revisions may add more (a table is removed only by a revision that
# drops it: scheduler 0002 dropped the never-written drain_state).
EXPECTED_TABLES = {
    "scheduler": {"alembic_version"},
    "autoscaler": {"alembic_version", "deployments", "instances"},
    "kvmeta": {"alembic_version", "index_checkpoints"},
    "telemetry": {"alembic_version", "request_records"},
}


def tables_in(url: str, schema: str) -> set[str]:
    with psycopg.connect(to_libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


@pytest.mark.parametrize("service", SERVICES, ids=SERVICES)
def test_migrate_creates_schema_and_tables_and_is_idempotent(
    postgres_db_url: str, service: str
) -> None:
    assert current_revision(postgres_db_url, service) is None
    migrate(postgres_db_url, service)
    tables = tables_in(postgres_db_url, service)
    assert EXPECTED_TABLES[service] <= tables
    head = current_revision(postgres_db_url, service)
    assert head is not None
    migrate(postgres_db_url, service)  # second run: nothing to do, no error
    assert current_revision(postgres_db_url, service) == head
    assert tables_in(postgres_db_url, service) == tables
    assert tables_in(postgres_db_url, "public") == set()


@pytest.mark.parametrize("service", SERVICES, ids=SERVICES)
def test_models_match_migrations(postgres_db_url: str, service: str) -> None:
    migrate(postgres_db_url, service)
    models = importlib.import_module(f"services.{service}.models")
    engine = sa.create_engine(to_async_url(postgres_db_url))
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": True,
                    "include_name": lambda name, type_, _parent: (
                        type_ != "schema" or name == service
                    ),
                    "compare_type": True,
                },
            )
            diff = compare_metadata(ctx, models.Base.metadata)
    finally:
        engine.dispose()
    # Every modelled table must match its migration exactly (columns, types, indexes,
    # constraints). Tables without a model (alembic_version, tables a service handles with
    # Core SQL only) show up as "remove_table" and are allowed.
    diff = [d for d in diff if not (isinstance(d, tuple) and d[0] == "remove_table")]
    assert diff == []


def test_concurrent_migrations_from_threads(postgres_db_url: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run(service: str) -> None:
        try:
            barrier.wait(timeout=30)
            migrate(postgres_db_url, service)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in ("kvmeta", "kvmeta")]
    threads += [threading.Thread(target=run, args=(s,)) for s in ("telemetry", "telemetry")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert EXPECTED_TABLES["kvmeta"] <= tables_in(postgres_db_url, "kvmeta")
    assert EXPECTED_TABLES["telemetry"] <= tables_in(postgres_db_url, "telemetry")


async def test_engine_uses_service_search_path_and_models_roundtrip(
    postgres_db_url: str,
) -> None:
    from services.kvmeta.models import IndexCheckpoint

    migrate(postgres_db_url, "kvmeta")
    engine = create_engine(postgres_db_url, "kvmeta")
    try:
        async with engine.connect() as conn:
            path = (await conn.execute(sa.text("SHOW search_path"))).scalar()
            assert path is not None and path.startswith("kvmeta")
            # Unqualified names resolve in the service schema.
            count = (await conn.execute(sa.text("SELECT count(*) FROM index_checkpoints"))).scalar()
            assert count == 0
        sessions = session_factory(engine)
        async with sessions() as session, session.begin():
            session.add(IndexCheckpoint(deployment="d", stream_id="1-0", snapshot=b"x"))
        async with sessions() as session:
            row = await session.get(IndexCheckpoint, 1)
            assert row is not None and row.snapshot == b"x"
            assert row.created_at is not None
    finally:
        await engine.dispose()


def test_scheduler_0002_drops_the_unused_drain_state(postgres_db_url: str) -> None:
    migrate(postgres_db_url, "scheduler", "0001")
    assert "drain_state" in tables_in(postgres_db_url, "scheduler")
    migrate(postgres_db_url, "scheduler", "0002")
    assert "drain_state" not in tables_in(postgres_db_url, "scheduler")
    assert current_revision(postgres_db_url, "scheduler") == "0002"


async def test_scheduler_0005_keeps_stored_responses_as_json_text(postgres_db_url: str) -> None:
    migrate(postgres_db_url, "scheduler", "0004")
    with psycopg.connect(to_libpq_url(postgres_db_url)) as conn:
        conn.execute(
            "INSERT INTO scheduler.responses VALUES ('resp_a', 't', 'm', NULL, "
            "to_timestamp(1), to_timestamp(4e9), %s::jsonb, '[]'::jsonb, %s::jsonb)",
            ('[{"type": "message", "content": "é"}]', '{"id": "resp_a"}'),
        )
    migrate(postgres_db_url, "scheduler", "0005")
    store = PostgresResponseStore(postgres_db_url)
    try:
        row = await store.get("resp_a", 2.0)
    finally:
        await store.close()
    assert row is not None
    assert row.input_items == ({"type": "message", "content": "é"},)
    assert (row.output_items, row.response) == ((), {"id": "resp_a"})


async def test_check_postgres_ok(postgres_url: str) -> None:
    await check_postgres(postgres_url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@127.0.0.1:1/db",
        "postgresql://postgres@/postgres?host=/nonexistent-dir",
        "mysql://u@h/db",
        "postgresql+asyncpg://u@h/db",
    ],
    ids=["refused-port", "missing-socket", "wrong-scheme", "wrong-driver"],
)
async def test_check_postgres_bad_url_raises_one_line(url: str) -> None:
    with pytest.raises(ConnectionError) as info:
        await check_postgres(url, timeout_s=3)
    text = str(info.value)
    assert "\n" not in text
    assert "secret" not in text


def test_migrate_unreachable_raises_connection_error() -> None:
    with pytest.raises(ConnectionError) as info:
        migrate("postgresql://u@127.0.0.1:1/db", "kvmeta")
    assert "\n" not in str(info.value)


def test_concurrent_migrations_from_two_processes(postgres_db_url: str) -> None:
    import subprocess
    import sys

    code = "import sys; from services.common.db import migrate; migrate(sys.argv[1], sys.argv[2])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, postgres_db_url, svc], stderr=subprocess.PIPE)
        for svc in ("autoscaler", "autoscaler", "scheduler")
    ]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else b"") for p in procs]
    assert [rc for rc, _ in results] == [0, 0, 0], results
    assert EXPECTED_TABLES["autoscaler"] <= tables_in(postgres_db_url, "autoscaler")
    assert EXPECTED_TABLES["scheduler"] <= tables_in(postgres_db_url, "scheduler")
