"""Pure parts of the database layer: URL normalisation and name validation."""

from __future__ import annotations

import pytest

from services.common.db import migrate, to_async_url, to_libpq_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        (
            "postgresql://postgres@/postgres?host=/tmp/x",
            "postgresql+psycopg://postgres@/postgres?host=/tmp/x",
        ),
    ],
    ids=["plain", "short-scheme", "already-psycopg", "unix-socket"],
)
def test_to_async_url(url: str, expected: str) -> None:
    assert to_async_url(url) == expected
    assert to_libpq_url(expected).startswith("postgresql://")


@pytest.mark.parametrize("bad", ["invalid name", "Kvmeta", "x;drop"], ids=["space", "upper", "sql"])
def test_invalid_service_name_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid service"):
        migrate("postgresql://u@h/db", bad)


@pytest.mark.parametrize(
    "url",
    ["mysql://u@h/db", "postgresql+asyncpg://u@h/db", "not a url"],
    ids=["other-database", "other-driver", "no-scheme"],
)
def test_to_async_url_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        to_async_url(url)
