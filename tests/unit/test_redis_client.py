"""The one Redis client factory: timeouts, health checks and retries from settings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.exceptions as redis_exc
from pydantic import ValidationError

from services.common.redis_client import RedisClientOptions, redis_client
from services.common.settings import load_settings
from services.kvmeta.settings import KVMetaSettings


def test_options_become_the_clients_connection_settings() -> None:
    opts = RedisClientOptions(socket_timeout_s=7.5, connect_timeout_s=2.0, health_check_s=3.0)
    kwargs = redis_client("redis://127.0.0.1:6379/0", opts).connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 7.5
    assert kwargs["socket_connect_timeout"] == 2.0
    assert kwargs["health_check_interval"] == 3.0
    assert kwargs["decode_responses"] is False
    assert kwargs["retry"].get_retries() == opts.retries == 3


@pytest.mark.parametrize(
    "bad",
    [{"socket_timeout_s": 1.0}, {"connect_timeout_s": 0}, {"retries": -1}, {"unknown": 1}],
    ids=["timeout-below-blocking-reads", "zero-connect-timeout", "negative-retries", "typo"],
)
def test_bad_options_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RedisClientOptions.model_validate(bad)


@pytest.mark.parametrize(
    ("yaml_text", "env", "timeout", "retries"),
    [
        ("redis_client: {socket_timeout_s: 8, retries: 1}\n", None, 8.0, 1),
        ("", "0", 10.0, 0),
        ("kvmeta: {redis_client: {retries: 5}}\n", None, 10.0, 5),
    ],
    ids=["yaml", "env", "service-section"],
)
def test_settings_read_the_options(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    yaml_text: str,
    env: str | None,
    timeout: float,
    retries: int,
) -> None:
    cfg = tmp_path / "tideserve.yaml"
    cfg.write_text(yaml_text)
    monkeypatch.setenv("TIDESERVE_CONFIG", str(cfg))
    if env is not None:
        monkeypatch.setenv("TIDESERVE_KVMETA__REDIS_CLIENT__RETRIES", env)
    settings = load_settings(KVMetaSettings, "kvmeta")
    assert settings.redis_client.socket_timeout_s == timeout
    assert settings.redis_client.retries == retries


async def test_a_server_that_never_answers_times_out_instead_of_hanging() -> None:
    """A wedged Redis (accepts, never replies): the command fails after the socket timeout."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(w)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # below the settings' floor (which keeps blocking reads working) to keep the test short
    opts = RedisClientOptions.model_construct(
        **(RedisClientOptions().model_dump() | {"socket_timeout_s": 0.2, "retries": 1})
    )
    client = redis_client(f"redis://127.0.0.1:{port}/0", opts)
    try:
        with pytest.raises(redis_exc.TimeoutError):
            await asyncio.wait_for(client.ping(), timeout=60)
        assert len(accepted) >= 2  # retried on a new connection
    finally:
        await client.aclose()
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()
