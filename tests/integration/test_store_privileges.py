"""Least privilege in the state stores, against real servers: each service's Redis ACL user
reaches only its own streams and keys (a redis-server started with the generated ACL file,
as ``tideserve up`` starts it), and each service's Postgres role only its own schema."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import redis

from services.common import db
from services.common.embedded import start_redis
from services.common.security.stores import (
    ENGINE_USER,
    SERVICES,
    pg_role,
    postgres_setup_sql,
    redis_acl_file,
    redis_user,
    with_credentials,
)

pytestmark = pytest.mark.integration

PASSWORDS = {who: f"pw-{who}" for who in (*SERVICES, ENGINE_USER)}
ADMIN = "admin-pw"


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server with the stack's ACL file; yields its admin URL."""
    data = tmp_path_factory.mktemp("acl-redis")
    acl = data / "users.acl"
    acl.write_text(redis_acl_file("ts", PASSWORDS, ADMIN))
    server = start_redis(data, 0, aclfile=acl, password=ADMIN)
    try:
        admin = redis.Redis.from_url(server.url)
        admin.xadd("ts:requests", {"p": b"1"})
        admin.hset("ts:inflight:d", "replica", "3")
        admin.xadd("ts:kv:d", {"p": b"1"})
        admin.close()
        yield server.url
    finally:
        server.stop()


def _as(url: str, who: str) -> redis.Redis:
    return redis.Redis.from_url(with_credentials(url, redis_user(who), PASSWORDS[who]))


REDIS_CASES = [
    # who, command, allowed
    ("autoscaler", ("XADD", "ts:membership", "*", "p", "1"), True),
    ("autoscaler", ("XRANGE", "ts:requests", "-", "+"), False),
    ("autoscaler", ("XADD", "ts:kv:d", "*", "p", "1"), False),
    ("telemetry", ("XRANGE", "ts:requests", "-", "+"), True),
    ("telemetry", ("XADD", "ts:requests:dead", "*", "p", "1"), True),
    ("telemetry", ("HGETALL", "ts:inflight:d"), False),
    ("telemetry", ("XADD", "ts:kv:d", "*", "p", "1"), False),
    ("kvmeta", ("XRANGE", "ts:kv:d", "-", "+"), True),
    ("kvmeta", ("XADD", "ts:resync:d", "*", "p", "1"), True),
    ("kvmeta", ("XRANGE", "ts:requests", "-", "+"), False),
    ("kvmeta", ("HGETALL", "ts:inflight:d"), False),
    ("scheduler", ("HGETALL", "ts:inflight:d"), True),
    ("scheduler", ("XADD", "ts:requests", "*", "p", "1"), True),
    ("scheduler", ("SET", "other:key", "1"), False),
    ("engine", ("XADD", "ts:kv:d", "*", "p", "1"), True),
    ("engine", ("XRANGE", "ts:membership", "-", "+"), False),
    ("engine", ("XRANGE", "ts:requests", "-", "+"), False),
    ("scheduler", ("KEYS", "*"), False),  # @dangerous
    ("kvmeta", ("FLUSHALL",), False),
    ("telemetry", ("CONFIG", "GET", "*"), False),
]


@pytest.mark.parametrize(
    ("who", "command", "allowed"),
    REDIS_CASES,
    ids=[f"{w}-{c[0]}-{c[1] if len(c) > 1 else ''}" for w, c, _ in REDIS_CASES],
)
def test_redis_user_reaches_only_its_keys(
    acl_redis: str, who: str, command: tuple[str, ...], allowed: bool
) -> None:
    client = _as(acl_redis, who)
    try:
        if allowed:
            client.execute_command(*command)
        else:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    finally:
        client.close()


def test_redis_without_credentials_is_refused(acl_redis: str) -> None:
    anonymous = redis.Redis.from_url(acl_redis.replace(f"default:{ADMIN}@", ""))
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.xrange("ts:requests")
    finally:
        anonymous.close()


def test_redis_consumer_group_flow_works_for_its_user(acl_redis: str) -> None:
    """What the telemetry consumer does on ts:requests: group, read, ack, claim, info."""
    client = _as(acl_redis, "telemetry")
    try:
        client.xgroup_create("ts:requests", "g", id="0", mkstream=True)
        got = client.xreadgroup("g", "c", {"ts:requests": ">"}, count=10)
        ids = [i for _, entries in got for i, _ in entries]
        assert ids and client.xack("ts:requests", "g", *ids) == len(ids)
        client.xautoclaim("ts:requests", "g", "c", 0)
        assert client.xinfo_stream("ts:requests")["length"] >= 1
        client.scan(match="ts:*")
    finally:
        client.close()


async def test_rate_limit_counters_work_for_the_scheduler_user(acl_redis: str) -> None:
    """The gateway's per-tenant windows (a Lua script on ``{prefix}:rl:*``) run as the
    scheduler's user; a refusal would only show as a silent per-replica fallback."""
    import redis.asyncio as aioredis

    from services.scheduler.keys.counters import RedisCounters

    url = with_credentials(acl_redis, redis_user("scheduler"), PASSWORDS["scheduler"])
    client = aioredis.Redis.from_url(url)
    try:
        counters = RedisCounters(client, prefix="ts")
        first = await counters.add("tenant-a", 7, 1, 100, 60_000)
        second = await counters.add("tenant-a", 7, 1, 50, 60_000)
        assert counters.failures == 0
        assert (first.cur_requests, second.cur_requests, second.cur_tokens) == (1, 2, 150)
    finally:
        await client.aclose()


def _pg(url: str, service: str) -> psycopg.Connection:
    return psycopg.connect(
        db.to_libpq_url(with_credentials(url, pg_role(service), f"pg-{service}")), autocommit=True
    )


@pytest.fixture
def provisioned(postgres_db_url: str) -> str:
    """A fresh database with every role and schema, kvmeta and telemetry migrated by their
    own roles; yields the superuser URL."""
    passwords = {svc: f"pg-{svc}" for svc in SERVICES}
    with psycopg.connect(db.to_libpq_url(postgres_db_url), autocommit=True) as conn:
        conn.execute('CREATE SCHEMA IF NOT EXISTS "kvmeta"')
        conn.execute('CREATE TABLE "kvmeta"."made_by_admin" (x int)')
        for statement in postgres_setup_sql(passwords, conn.info.dbname):
            conn.execute(statement.encode())
    for svc in ("kvmeta", "telemetry"):
        db.migrate(with_credentials(postgres_db_url, pg_role(svc), f"pg-{svc}"), svc)
    return postgres_db_url


PG_CASES = [
    ("kvmeta", 'SELECT count(*) FROM "kvmeta".alembic_version', True),
    ("kvmeta", 'INSERT INTO "kvmeta"."made_by_admin" VALUES (1)', True),
    ("kvmeta", 'CREATE TABLE "kvmeta"."mine" (x int)', True),
    ("kvmeta", 'SELECT count(*) FROM "telemetry".alembic_version', False),
    ("kvmeta", 'CREATE TABLE "telemetry"."intruder" (x int)', False),
    ("kvmeta", "CREATE TABLE public.intruder (x int)", False),
    ("kvmeta", 'CREATE SCHEMA "extra"', False),
    ("telemetry", 'DROP TABLE "kvmeta"."made_by_admin"', False),
    ("telemetry", 'SELECT count(*) FROM "kvmeta".alembic_version', False),
    ("telemetry", 'SELECT count(*) FROM "telemetry".alembic_version', True),
]


@pytest.mark.parametrize(
    ("service", "statement", "allowed"),
    PG_CASES,
    ids=[
        f"{s}-{st.split()[0]}-{'ok' if a else 'refused'}-{i}"
        for i, (s, st, a) in enumerate(PG_CASES)
    ],
)
def test_postgres_role_owns_only_its_schema(
    provisioned: str, service: str, statement: str, allowed: bool
) -> None:
    with _pg(provisioned, service) as conn:
        if allowed:
            conn.execute(statement.encode())
        else:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement.encode())


def test_provisioning_is_idempotent(provisioned: str) -> None:
    passwords = {svc: f"pg-{svc}" for svc in SERVICES}
    with psycopg.connect(db.to_libpq_url(provisioned), autocommit=True) as conn:
        for statement in postgres_setup_sql(passwords, conn.info.dbname):
            conn.execute(statement.encode())
        owner = conn.execute(
            "SELECT tableowner FROM pg_tables WHERE schemaname = 'kvmeta' AND tablename = 'made_by_admin'"
        ).fetchone()
    assert owner == (pg_role("kvmeta"),)
    db.migrate(with_credentials(provisioned, pg_role("kvmeta"), "pg-kvmeta"), "kvmeta")
