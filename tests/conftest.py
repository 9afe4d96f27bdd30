"""Shared fixtures: real Postgres and Redis for integration tests, found lazily.

Order for each server (first that works):
1. ``TIDESERVE_TEST_POSTGRES_URL`` / ``TIDESERVE_TEST_REDIS_URL`` from the environment;
2. testcontainers, when it is importable and a Docker engine answers a ping;
3. the embedded servers (``services.common.embedded``) in a fresh directory under the
   system temp dir, started once per session and stopped at its end.

Fixtures are lazy: a test that asks for none of them (all of ``tests/unit``) starts nothing.

- ``postgres_url`` (session): a libpq URL (``postgresql://...``). Pass it to
  ``services.common.db.migrate`` / ``create_engine`` as is.
- ``postgres_db_url`` (function): a brand-new, empty database on that server, dropped after
  the test; use it when a test needs a clean slate (e.g. migrations from scratch).
- ``pg_schema_reset`` (function): ``reset(*schemas)`` drops those schemas (CASCADE) on
  ``postgres_url``; call it before ``migrate`` to start a service schema from scratch.
- ``redis_url`` (session): ``redis://host:port/0``.
- ``redis_client`` (function): ``redis.asyncio.Redis`` on ``redis_url``; its DB is flushed
  after the test.
- ``redis`` (function): ``redis.asyncio.Redis`` on ``redis_url`` (bytes responses), closed
  after the test; nothing is flushed (tests keep to their own stream names).
- ``http`` (function): an ``aiohttp.ClientSession`` with a 60 s total timeout.
- ``servers`` (function): ``await servers(app)`` serves an aiohttp app on 127.0.0.1 and
  returns its base URL (no trailing slash); every server is closed after the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.databases import fresh_database

_PG_ENV = "TIDESERVE_TEST_POSTGRES_URL"
_REDIS_ENV = "TIDESERVE_TEST_REDIS_URL"


def _terminate_like_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (`timeout`, a CI job limit) unwinds like Ctrl-C, so session
    # fixtures still stop the embedded Postgres and Redis instead of orphaning them.
    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    _hypothesis_profiles()


def _hypothesis_profiles() -> None:
    """Property-based tests: ``ci`` (default: few examples, so `make test` stays short, no
    deadline on a loaded machine) or ``long`` (``HYPOTHESIS_PROFILE=long``, by hand)."""
    from hypothesis import HealthCheck, settings

    relaxed = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
    settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=relaxed)
    settings.register_profile(
        "long", max_examples=2000, deadline=None, suppress_health_check=relaxed
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _docker_answers() -> bool:
    """True when testcontainers is importable and a Docker engine answers a ping."""
    try:
        import docker  # type: ignore[import-not-found]
        import testcontainers  # type: ignore[import-not-found]  # noqa: F401
    except Exception:
        return False
    try:
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@contextlib.contextmanager
def _embedded_dir(kind: str) -> Iterator[Path]:
    # Directly under the system temp dir (short unix-socket path, world-traversable so the
    # embedded postgres system user can reach it when tests run as root).
    path = Path(tempfile.mkdtemp(prefix=f"tideserve-test-{kind}-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    env = os.environ.get(_PG_ENV)
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield str(pg.get_connection_url())
        return
    from services.common.embedded import start_postgres

    with _embedded_dir("pg") as path:
        server = start_postgres(path)
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    env = os.environ.get(_REDIS_ENV)
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7-alpine") as rc:
            host = rc.get_container_host_ip()
            port = rc.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    from services.common.embedded import start_redis

    with _embedded_dir("redis") as path:
        server = start_redis(path, 0)
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def postgres_db_url(postgres_url: str) -> Iterator[str]:
    """A fresh empty database for this test only (dropped afterwards)."""
    with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture
def pg_schema_reset(postgres_url: str) -> Callable[..., None]:
    """``reset("kvmeta", ...)``: drop the named schemas (and everything in them)."""
    import psycopg

    def reset(*schemas: str) -> None:
        admin = postgres_url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(admin, autocommit=True) as conn:
            for schema in schemas:
                if not schema.replace("_", "").isalnum():
                    raise ValueError(f"bad schema name {schema!r}")
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return reset


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    """``redis.asyncio.Redis`` (bytes responses); the DB is flushed after the test."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.flushdb()
        await client.aclose()


@pytest.fixture(name="redis")
async def redis_conn(redis_url: str) -> AsyncIterator[Any]:
    """``redis.asyncio.Redis`` (bytes responses), closed after the test; no flush."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    yield client
    await client.aclose()


@pytest.fixture(name="http")
async def http_session() -> AsyncIterator[Any]:
    """``aiohttp.ClientSession`` with a 60 s total timeout, closed after the test."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


@pytest.fixture(name="servers")
async def aiohttp_servers() -> AsyncIterator[Callable[[Any], Any]]:
    """``await servers(app)`` -> base URL of ``app`` served on 127.0.0.1; all closed after."""
    from aiohttp.test_utils import TestServer

    started: list[TestServer] = []

    async def start(app: Any) -> str:
        s = TestServer(app, host="127.0.0.1")
        await s.start_server()
        started.append(s)
        return str(s.make_url("")).rstrip("/")

    yield start
    for s in started:
        await s.close()
