"""Database layer: SQLAlchemy 2 (async, psycopg 3), one Postgres schema per service,
Alembic migrations applied programmatically at service start.

Each service ``svc`` owns Postgres schema ``svc``; its typed models live in
``services/<svc>/models.py`` and its Alembic scripts in ``services/<svc>/migrations``
(``env.py`` calls :func:`run_migrations_online`; no ``alembic.ini``). Alembic's version
table is ``<svc>.alembic_version``.

URLs: any libpq URL (``postgresql://user:pw@host:5432/db``, or a unix socket such as
``postgresql://postgres@/postgres?host=/tmp/dir`` as produced by the embedded server);
``postgresql+psycopg://`` is accepted too.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import threading
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine
from sqlalchemy.pool import NullPool

__all__ = [
    "SERVICES",
    "alembic_config",
    "check_postgres",
    "create_engine",
    "current_revision",
    "migrate",
    "migrations_dir",
    "run_migrations_online",
    "session_factory",
    "to_async_url",
    "to_libpq_url",
]

SERVICES = ("scheduler", "autoscaler", "kvmeta", "telemetry")

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")

# Alembic's ``context``/``op`` proxies are process-global, so two migrations may not run
# at the same time in one process (even for different schemas); across processes the
# advisory lock in ``migrate`` serialises them.
_ALEMBIC_LOCK = threading.Lock()
_DRIVER = "postgresql+psycopg"


# --------------------------------------------------------------------------- URLs


def to_async_url(url: str) -> str:
    """SQLAlchemy URL using psycopg 3 (works for both async and sync engines).

    ``postgresql://`` / ``postgres://`` become ``postgresql+psycopg://``; a psycopg URL is
    returned unchanged. Raises ``ValueError`` for another scheme or driver.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"postgres_url {_redact(url)!r} is not a URL (postgresql://...)")
    if scheme in ("postgresql", "postgres"):
        return f"{_DRIVER}://{rest}"
    if scheme in (_DRIVER, "postgresql+psycopg_async"):
        return url
    raise ValueError(
        f"postgres_url scheme {scheme!r} is not supported; use postgresql:// (psycopg 3)"
    )


def to_libpq_url(url: str) -> str:
    """Plain ``postgresql://`` URL for psycopg / libpq (strips a SQLAlchemy driver suffix)."""
    _scheme, sep, rest = to_async_url(url).partition("://")
    return f"postgresql{sep}{rest}"


def _redact(url: str) -> str:
    try:
        parts = urlsplit(url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        pass
    return url


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _check_service(service: str) -> str:
    if not _NAME.match(service):
        raise ValueError(f"invalid service/schema name {service!r}")
    return service


# --------------------------------------------------------------------------- migrations


def migrations_dir(service: str) -> Path:
    """``services/<service>/migrations`` of the installed package."""
    pkg = importlib.import_module(f"services.{_check_service(service)}")
    if pkg.__file__ is None:
        raise FileNotFoundError(f"services.{service} has no location")
    path = Path(pkg.__file__).parent / "migrations"
    if not (path / "env.py").exists():
        raise FileNotFoundError(f"no Alembic migrations for service {service!r} at {path}")
    return path


def alembic_config(service: str, connection: sa.Connection | None = None) -> Config:
    """An Alembic ``Config`` for ``service`` (script location set, no ini file).

    Useful for ``alembic.command.revision(alembic_config("kvmeta"), "add objects")``.
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir(service)))
    cfg.attributes["schema"] = service
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _lock_key(service: str) -> int:
    # A stable 63-bit key per service (pg advisory locks take a bigint).
    return 0x7EDE_0000_0000 | zlib.crc32(f"tideserve-migrate:{service}".encode())


def migrate(url: str, service: str, revision: str = "head") -> None:
    """Create schema ``service`` if missing and upgrade it to ``revision``.

    Idempotent; concurrent callers (threads or processes) serialise on a Postgres
    advisory lock, and the whole upgrade runs in one transaction (DDL is transactional
    in Postgres), so a failed migration leaves the schema as it was. Blocking: from
    asyncio call ``await asyncio.to_thread(migrate, url, service)``. Raises
    ``ConnectionError`` (one line) when Postgres is unreachable.
    """
    _check_service(service)
    script_dir = migrations_dir(service)
    engine = sa.create_engine(to_async_url(url), poolclass=NullPool)
    try:
        try:
            conn = engine.connect()
        except sa.exc.OperationalError as exc:
            raise ConnectionError(
                f"cannot reach Postgres at {_redact(url)}: {_one_line(exc.orig or exc)}"
            ) from None
        with _ALEMBIC_LOCK, conn, conn.begin():
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(service)})
            # CREATE SCHEMA needs CREATE on the database even when the schema exists: a
            # service role that owns only its (provisioned) schema must not need it.
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": service}
            ).scalar()
            if exists is None:
                conn.execute(sa.text(f'CREATE SCHEMA "{service}"'))
            cfg = alembic_config(service, conn)
            cfg.set_main_option("script_location", str(script_dir))
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def current_revision(url: str, service: str) -> str | None:
    """The Alembic revision schema ``service`` is at, or None if never migrated."""
    _check_service(service)
    engine = sa.create_engine(to_async_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT to_regclass(:t)"), {"t": f"{service}.alembic_version"}
            ).scalar()
            if exists is None:
                return None
            rev = conn.execute(sa.text(f'SELECT version_num FROM "{service}".alembic_version'))
            value = rev.scalar()
            return None if value is None else str(value)
    finally:
        engine.dispose()


def run_migrations_online(metadata: sa.MetaData) -> None:
    """Body of every ``services/<svc>/migrations/env.py`` (runs inside Alembic).

    Uses the connection :func:`migrate` put into ``config.attributes`` (or opens one from
    ``config.attributes["url"]``); version table in the service schema.
    """
    from alembic import context

    if context.is_offline_mode():
        raise RuntimeError("offline (--sql) migrations are not supported")
    schema = str(context.config.attributes["schema"])
    conn = context.config.attributes.get("connection")
    if conn is None:
        url = context.config.attributes.get("url")
        if url is None:
            raise RuntimeError("run migrations through services.common.db.migrate()")
        engine = sa.create_engine(to_async_url(str(url)), poolclass=NullPool)
        try:
            with engine.begin() as own:
                _configure_and_run(own, metadata, schema)
        finally:
            engine.dispose()
        return
    _configure_and_run(conn, metadata, schema)


def _configure_and_run(conn: sa.Connection, metadata: sa.MetaData, schema: str) -> None:
    from alembic import context

    context.configure(
        connection=conn,
        target_metadata=metadata,
        version_table_schema=schema,
        include_schemas=False,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


# --------------------------------------------------------------------------- runtime


def create_engine(url: str, service: str, **kwargs: Any) -> AsyncEngine:
    """Async engine (psycopg 3) whose sessions use ``search_path = <service>, public``.

    Extra keyword arguments go to ``create_async_engine`` (e.g. ``pool_size``).
    """
    _check_service(service)
    connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("options", f"-c search_path={service},public")
    kwargs.setdefault("pool_pre_ping", True)
    return _create_async_engine(to_async_url(url), connect_args=connect_args, **kwargs)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded attributes usable after commit."""
    return async_sessionmaker(engine, expire_on_commit=False)


async def check_postgres(url: str, timeout_s: float = 5.0) -> None:
    """Connect and ``SELECT 1``; raises ``ConnectionError`` with a one-line message."""
    import psycopg

    try:
        conninfo = to_libpq_url(url)
    except ValueError as exc:
        raise ConnectionError(str(exc)) from None
    try:
        async with asyncio.timeout(timeout_s):
            conn = await psycopg.AsyncConnection.connect(
                conninfo, connect_timeout=max(1, int(timeout_s))
            )
            try:
                await conn.execute("SELECT 1")
            finally:
                await conn.close()
    except TimeoutError:
        raise ConnectionError(
            f"cannot reach Postgres at {_redact(url)}: no answer within {timeout_s:g}s"
        ) from None
    except (psycopg.Error, OSError, ValueError) as exc:
        raise ConnectionError(
            f"cannot reach Postgres at {_redact(url)}: {_one_line(exc)}"
        ) from None
