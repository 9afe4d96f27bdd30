"""A fresh empty Postgres database on a shared server, dropped afterwards."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

__all__ = ["fresh_database", "with_database"]


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database on the same server (query, e.g. host=, kept)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@contextlib.contextmanager
def fresh_database(postgres_url: str) -> Iterator[str]:
    """The URL of a new empty database on ``postgres_url``'s server (dropped on exit)."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(postgres_url, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
