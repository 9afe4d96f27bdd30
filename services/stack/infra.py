"""How ``tideserve up`` gets Postgres and Redis and migrates (:class:`Infra`, injectable for
tests; :func:`default_infra` is the real thing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from services.stack.secure import StackSecrets, provision_postgres, write_redis_acl

__all__ = ["Infra", "Server", "default_infra"]


class Server(Protocol):
    """An embedded server as returned by services.common.embedded."""

    @property
    def url(self) -> str: ...
    @property
    def pid(self) -> int: ...
    def stop(self) -> None: ...


@dataclass(frozen=True)
class Infra:
    """How ``up`` gets Postgres and Redis and migrates (injectable for tests)."""

    start_postgres: Callable[[Path], Server]
    start_redis: Callable[[Path, int], Server]
    migrate: Callable[[str, str], None]
    check_postgres: Callable[[str], None] = lambda url: None
    """Raise (one line) when an external Postgres URL does not answer."""
    check_redis: Callable[[str], None] = lambda url: None
    """Raise (one line) when an external Redis URL does not answer."""


def default_infra(secrets: StackSecrets | None = None, stream_prefix: str = "ts") -> Infra:
    """The real thing: services.common.embedded and services.common.db.migrate. With
    ``secrets`` the embedded Redis runs with one ACL user per service (and a password on
    ``default``) and the embedded Postgres gets one role per service owning its schema
    (services.stack.secure)."""

    def start_postgres(data_dir: Path) -> Server:
        from services.common.embedded import start_postgres as start

        server = start(data_dir)
        if secrets is not None:
            try:
                provision_postgres(secrets, server.url)
            except Exception:
                server.stop()
                raise
        return server

    def start_redis(data_dir: Path, port: int) -> Server:
        from services.common.embedded import start_redis as start

        if secrets is None:
            return start(data_dir, port)
        acl = write_redis_acl(secrets, data_dir, stream_prefix)
        return start(data_dir, port, aclfile=acl, password=secrets.redis_admin)

    def migrate(url: str, service: str) -> None:
        from services.common.db import migrate as run

        run(url, service)

    def check_postgres(url: str) -> None:
        from services.common.db import check_postgres as check

        asyncio.run(check(url))

    def check_redis(url: str) -> None:
        from services.common.streams import check_redis as check

        asyncio.run(check(url))

    return Infra(start_postgres, start_redis, migrate, check_postgres, check_redis)
