"""API keys in a real Postgres: the store (only hashes at rest) and ``tideserve keys
create|list|revoke`` end to end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psycopg
import pytest

from services.cli import main as cli
from services.common import db
from services.scheduler.keys.model import hash_key, looks_like_key
from services.scheduler.keys.store import AmbiguousKey, KeyStore
from services.scheduler.settings import SchedulerSettings
from tests.helpers.engines import EngineFleet
from tests.helpers.ports import free_ports
from tests.helpers.scheduler import scheduler_service

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


async def test_the_scheduler_service_checks_keys_from_postgres(
    postgres_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Settings to service: api_keys on, keys from Postgres (as ``tideserve keys`` writes
    them), counted in Redis; a refusal is on the gateway's /metrics."""
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    _, engine = await fleet.start()
    db.migrate(postgres_db_url, "scheduler")  # run_service does it before serving
    store = KeyStore(postgres_db_url)
    _, key = await store.create("acme", rpm=2)
    await store.close()
    (http_port,) = free_ports(1)
    settings = SchedulerSettings(
        grpc_port=0,
        http_port=http_port,
        metrics_port=0,
        endpoints=[engine],
        perf_profile="test",
        state_dir=tmp_path,
        api_keys=True,
        postgres_url=postgres_db_url,
        redis_url=redis_url,
        stream_prefix=f"t{http_port}",
        request_records=False,
    )
    base = f"http://127.0.0.1:{http_port}"
    body = {"model": "tideserve-sim", "prompt": "hello there", "max_tokens": 2}
    auth = {"Authorization": f"Bearer {key}"}
    try:
        async with scheduler_service(settings), aiohttp.ClientSession() as http:

            async def status(headers: dict[str, str]) -> int:
                async with http.post(base + "/v1/completions", json=body, headers=headers) as r:
                    return r.status

            assert await status({}) == 401
            assert [await status(auth) for _ in range(3)] == [200, 200, 429]
            async with http.get(base + "/metrics") as r:
                text = await r.text()
            assert 'tideserve_gateway_auth_refused_total{reason="missing_key"} 1.0' in text
            assert 'tideserve_gateway_auth_refused_total{reason="rate_requests"} 1.0' in text
    finally:
        await fleet.close()
