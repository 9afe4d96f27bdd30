"""The engine's KV bytes over a fake Transfer Engine (copies within this process): cached
blocks get their contents, a pull is verified, and a failed or timed-out pull is reported
(the caller recomputes) with the staging slots kept out of use until the native call ends."""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.common.dataplane.blocks import block_content
from services.common.dataplane.location import KVLocation
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.transfer import DataPlane
from services.engine.kvbytes import KVBytes
from tests.helpers.dataplane import FakeNative
from tests.helpers.waits import eventually

BB = 256
HASHES = [11, 22, 33, 44]


async def _kvbytes(native: type[Any], timeout_s: float = 5.0) -> KVBytes:
    plane = DataPlane(DataPlaneSettings("127.0.0.1:1", transfer_timeout_s=timeout_s), native=native)
    kvb = KVBytes(plane, cache_blocks=4, staging_blocks=4, block_bytes=BB)
    await kvb.start()
    return kvb


@pytest.fixture
async def peer() -> AsyncIterator[KVBytes]:
    kvb = await _kvbytes(FakeNative)
    kvb.fill([(h, slot) for slot, h in enumerate(HASHES)])
    yield kvb
    await kvb.close()


def _loc(peer: KVBytes, order: list[int] | None = None) -> KVLocation:
    slots: list[int | None] = list(order if order is not None else range(len(HASHES)))
    return peer.location(slots)


async def test_pull_moves_and_verifies(peer: KVBytes) -> None:
    me = await _kvbytes(FakeNative)
    try:
        res = await me.pull(_loc(peer), HASHES, 1, timeout_s=5)  # block 0 held locally
        assert (res.ok, res.blocks, res.nbytes) == (True, 3, 3 * BB)
        assert me._staging.free == 4  # given back
        assert me.arena is not None
        assert me.arena.read(4 * BB, BB) == block_content(HASHES[1], BB)  # first staging slot
    finally:
        await me.close()


@pytest.mark.parametrize(
    ("order", "bb", "error"),
    [([1, 0, 2, 3], BB, "wrong bytes"), (None, 2 * BB, "peer blocks are")],
    ids=["swapped-blocks", "block-size"],
)
async def test_bad_pull_is_reported(
    peer: KVBytes, order: list[int] | None, bb: int, error: str
) -> None:
    me = await _kvbytes(FakeNative)
    try:
        loc = _loc(peer, order)
        loc = KVLocation(loc.segment, bb, loc.addrs)
        res = await me.pull(loc, HASHES, 0, timeout_s=5)
        assert not res.ok and error in res.error
        assert me.pulls_failed == 1 and me._staging.free == 4
    finally:
        await me.close()


async def test_timed_out_pull_keeps_staging_until_the_call_returns(peer: KVBytes) -> None:
    gate = threading.Event()
    me = await _kvbytes(type("Stuck", (FakeNative,), {"gate": gate}))
    try:
        res = await me.pull(_loc(peer), HASHES, 0, timeout_s=0.05)
        assert not res.ok and "not done after" in res.error
        assert me._staging.free == 0  # the native call may still write them
        assert (await me.pull(_loc(peer), HASHES, 0, timeout_s=0.05)).error.startswith(
            "no staging space"
        )
        gate.set()

        async def given_back() -> bool:  # once the native call has ended
            return me._staging.free == 4

        await eventually(given_back)
    finally:
        await me.close()


def test_engine_without_the_native_library_exits_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.engine.cli import main

    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # as without the wheel
    code = main(["--kv-data-plane", "--port", "0", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "tideserve engine: data plane: the Mooncake Transfer Engine cannot be loaded" in err
    assert "mooncake-transfer-engine-non-cuda" in err and "libibverbs1" in err


@pytest.mark.parametrize(
    ("profile", "cached", "fetch", "want"),
    [
        ("test", 0, 640, True),
        ("test", 576, 64, True),
        ("test", 0, 0, False),
        ("h200-llama3.1-8b", 0, 640, True),
    ],
    ids=["long-prefix", "one-block-after-context", "nothing", "h200"],
)
def test_fetch_pays_when_the_transfer_beats_prefill(
    profile: str, cached: int, fetch: int, want: bool
) -> None:
    from services.common.perfmodel import get_profile
    from services.engine.tier_io import fetch_pays

    assert fetch_pays(get_profile(profile), cached, fetch) is want


def test_fetch_does_not_pay_over_a_slow_link() -> None:
    import dataclasses

    from services.common.perfmodel import get_profile
    from services.engine.tier_io import fetch_pays

    slow = dataclasses.replace(get_profile("test"), link_bandwidth=1e6)  # 1 MB/s
    assert fetch_pays(slow, 0, 640) is False
