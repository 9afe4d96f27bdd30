"""How ``tideserve up`` gets Postgres and Redis and migrates (:class:`Infra`, injectable for
tests; :func:`default_infra` is the real thing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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


def default_infra() -> Infra:
    """The real thing: services.common.embedded and services.common.db.migrate."""

    def start_postgres(data_dir: Path) -> Server:
        from services.common.embedded import start_postgres as start

        return start(data_dir)

    def start_redis(data_dir: Path, port: int) -> Server:
        from services.common.embedded import start_redis as start

        return start(data_dir, port)

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
