"""API keys in a real Postgres: the store (only hashes at rest) and ``tideserve keys
create|list|revoke`` end to end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import psycopg
import pytest

from services.cli import main as cli
from services.common import db
from services.scheduler.keys.model import hash_key, looks_like_key
from services.scheduler.keys.store import AmbiguousKey, KeyStore

pytestmark = pytest.mark.integration


@pytest.fixture
async def store(postgres_db_url: str) -> AsyncIterator[KeyStore]:
    db.migrate(postgres_db_url, "scheduler")
    s = KeyStore(postgres_db_url)
    yield s
    await s.close()


async def test_create_lookup_revoke(store: KeyStore, postgres_db_url: str) -> None:
    key, secret = await store.create(
        "acme", slo_classes=["agent", "batch"], rpm=60, tpm=1000, name="ci"
    )
    assert looks_like_key(secret) and secret.startswith(key.prefix)
    assert (key.tenant, key.slo_classes, key.rpm, key.tpm, key.live) == (
        "acme",
        ("agent", "batch"),
        60,
        1000,
        True,
    )
    assert await store.by_hash(hash_key(secret)) == key
    assert await store.by_hash(hash_key(secret + "x")) is None
    # the secret is nowhere in the table: only its hash and a short prefix
    with psycopg.connect(db.to_libpq_url(postgres_db_url)) as conn:
        rows = conn.execute("SELECT * FROM scheduler.api_keys").fetchall()
    assert secret not in repr(rows) and secret[12:20] not in repr(rows)
    revoked = await store.revoke(key.key_id)
    assert revoked is not None and not revoked.live
    again = await store.revoke(key.prefix)  # idempotent, first revocation time kept
    assert again is not None and again.revoked_at == revoked.revoked_at
    found = await store.by_hash(hash_key(secret))
    assert found is not None and not found.live
    assert await store.list() == []
    assert [k.key_id for k in await store.list(include_revoked=True)] == [key.key_id]
    assert await store.revoke("key_nosuch") is None


@pytest.mark.parametrize(
    ("tenant", "rpm"),
    [("a:b", None), ("", None), ("acme", 0)],
    ids=["colon-in-tenant", "empty-tenant", "zero-rpm"],
)
async def test_create_refuses_bad_input(store: KeyStore, tenant: str, rpm: int | None) -> None:
    with pytest.raises(ValueError):
        await store.create(tenant, rpm=rpm)


async def test_revoking_an_ambiguous_prefix_is_refused(store: KeyStore) -> None:
    # two keys with one visible prefix cannot be produced by chance; forge the second's
    a, _ = await store.create("acme")
    b, _ = await store.create("acme")
    async with store.engine.begin() as conn:
        from sqlalchemy import text

        await conn.execute(
            text("UPDATE scheduler.api_keys SET prefix = :p WHERE key_id = :k"),
            {"p": a.prefix, "k": b.key_id},
        )
    with pytest.raises(AmbiguousKey):
        await store.revoke(a.prefix)


def test_cli_create_list_revoke(postgres_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--postgres-url", postgres_db_url, "--json"]
    assert cli(["keys", "create", "--tenant", "acme", "--class", "agent", "--rpm", "5", *base]) == 0
    made = json.loads(capsys.readouterr().out)
    assert looks_like_key(made["key"]) and made["tenant"] == "acme"
    assert made["slo_classes"] == ["agent"] and made["rpm"] == 5 and made["tpm"] is None
    assert cli(["keys", "list", *base]) == 0
    listed = json.loads(capsys.readouterr().out)["keys"]
    assert [k["key_id"] for k in listed] == [made["key_id"]]
    assert "key" not in listed[0]  # never the secret
    assert cli(["keys", "list", "--postgres-url", postgres_db_url]) == 0
    table = capsys.readouterr().out
    assert made["prefix"] in table and made["key"] not in table
    assert cli(["keys", "revoke", made["key_id"], *base]) == 0
    assert json.loads(capsys.readouterr().out)["revoked_at"] is not None
    assert cli(["keys", "list", *base]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == []
    assert cli(["keys", "revoke", "key_nosuch", *base]) == 2
    assert "no key" in capsys.readouterr().err
    assert cli(["keys", "create", "--tenant", "bad:name", *base]) == 2
    assert "tenant" in capsys.readouterr().err
