"""The retention route's ``prefetch`` field: jobs are checked (400 on a bad one), started in
the background once per id, and reported on ``GET`` (pending, then done or failed) with the
engine's ``profile`` and ``block_size``. The tier side is a fake here (the Transfer Engine
path is in ``tests/integration/test_kvcache_tier.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.engine.tier_io import Prefetched
from tests.helpers.waits import eventually

PATH = "/tideserve/retention"


class FakeTier:
    """Stands in for TierIO.prefetch: each call waits for ``go``, then answers ``result``."""

    def __init__(self, result: Prefetched) -> None:
        self.result = result
        self.go = asyncio.Event()
        self.calls: list[tuple[tuple[int, ...], str]] = []

    async def prefetch(self, hashes: Sequence[int], tenant: str = "") -> Prefetched:
        self.calls.append((tuple(hashes), tenant))
        await self.go.wait()
        return self.result


async def engine_url(servers: Callable[..., Any], tmp_path: Path) -> tuple[EngineServer, str]:
    s = EngineSettings(port=0, instance_id="e0", profile="test", block_size=16, kv_blocks=64,
                       state_dir=tmp_path / "e0")  # fmt: skip
    engine = EngineServer(s)
    return engine, await servers(engine.app())


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(url + PATH, json=body) as r:
        return r.status, await r.json()


async def state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + PATH) as r:
        assert r.status == 200
        return dict(await r.json())


@pytest.mark.parametrize(
    "body",
    [
        {"prefetch": {"id": "a"}},
        {"prefetch": [{"hashes": [1]}]},
        {"prefetch": [{"id": "", "hashes": [1]}]},
        {"prefetch": [{"id": "a", "hashes": []}]},
        {"prefetch": [{"id": "a", "hashes": [-1]}]},
        {"prefetch": [{"id": "a", "hashes": ["1"]}]},
        {"prefetch": [{"id": "a", "hashes": [1], "tenant": 3}]},
    ],
    ids=["not-a-list", "no-id", "empty-id", "no-hashes", "negative", "string", "tenant"],
)
async def test_bad_prefetch_is_400(
    servers: Callable[..., Any], tmp_path: Path, http: aiohttp.ClientSession, body: Any
) -> None:
    engine, url = await engine_url(servers, tmp_path)
    status, got = await post(http, url, body)
    assert status == 400 and "prefetch" in got["error"]["message"]
    assert engine.prefetcher.started == 0


async def test_without_a_tier_a_prefetch_fails_at_once(
    servers: Callable[..., Any], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    _, url = await engine_url(servers, tmp_path)
    status, got = await post(http, url, {"prefetch": [{"id": "s1", "hashes": [7, 8]}]})
    assert status == 200 and got["prefetch_started"] == 1
    assert got["prefetches"]["s1"]["state"] == "failed"
    assert "no KV-cache tier" in got["prefetches"]["s1"]["error"]
    assert (got["profile"], got["block_size"], got["prefetch_pending"]) == ("test", 16, 0)


@pytest.mark.parametrize(
    ("result", "final"),
    [(Prefetched(1, 2), "done"), (Prefetched(0, 0, "the tier holds none"), "failed")],
    ids=["done", "failed"],
)
async def test_prefetch_runs_in_the_background_once_per_id(
    servers: Callable[..., Any],
    tmp_path: Path,
    http: aiohttp.ClientSession,
    result: Prefetched,
    final: str,
) -> None:
    engine, url = await engine_url(servers, tmp_path)
    fake = FakeTier(result)
    engine.prefetcher.tier_io = fake  # type: ignore[assignment]
    job = {"id": "s1", "hashes": [7, 8, 9], "tenant": "t"}
    _, got = await post(http, url, {"prefetch": [job]})
    assert got["prefetch_started"] == 1
    assert got["prefetch_pending"] == 3 and got["prefetches"]["s1"]["state"] == "pending"
    _, again = await post(http, url, {"prefetch": [job]})  # the controller repeats itself
    assert again["prefetch_started"] == 0
    fake.go.set()

    async def finished() -> bool:
        return bool((await state(http, url))["prefetches"]["s1"]["state"] != "pending")

    await eventually(finished)
    view = (await state(http, url))["prefetches"]["s1"]
    assert view["state"] == final
    assert (view["resident"], view["fetched"], view["error"]) == (
        result.resident, result.fetched, result.error
    )  # fmt: skip
    _, third = await post(http, url, {"prefetch": [job]})
    assert third["prefetch_started"] == (1 if final == "failed" else 0)  # a failed one retries
    assert fake.calls[0] == ((7, 8, 9), "t")
