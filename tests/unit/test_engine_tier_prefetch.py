"""The engine's prefetch from the KV-cache tier (:meth:`TierIO.prefetch`) with a fake tier
in this process: blocks are read straight into reserved cache slots, verified, and adopted
(resident, protected, one STORED event); what the tier lacks, wrong bytes, a failed read
and a full cache each stop it with the slots given back; a request whose prefix a prefetch
is bringing in waits for it and then finds it resident."""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from services.common.dataplane.blocks import block_content
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.tier import block_key
from services.common.dataplane.transfer import DataPlane
from services.common.engine_core.core import Request
from services.common.engine_core.kvcache import KVCache, KVEventKind
from services.common.perfmodel import get_profile
from services.common.tokens import block_hashes
from services.engine.api import GenRequest
from services.engine.kvbytes import KVBytes
from services.engine.tier_io import TierIO
from tests.helpers.dataplane import FakeNative

BS, SIZE, CAP = 4, 64, 8
PROMPT = tuple(range(1000, 1000 + 5 * BS + 1))  # 5 full blocks and a tail
CHAIN = block_hashes(PROMPT, BS)


@dataclass
class Exists:
    exists: list[bool]


@dataclass
class FakeTier:
    """The tier's surface TierIO uses: Exist over the held keys, fetch into addresses."""

    held: set[str]
    wrong: bool = False
    fail: bool = False
    gate: asyncio.Event | None = None
    reading: asyncio.Event = field(default_factory=asyncio.Event)
    deployment: str = "d"
    tenant: str = ""
    reads: list[list[int]] = field(default_factory=list)

    @property
    def stub(self) -> FakeTier:
        return self

    async def Exist(self, req: Any) -> Exists:
        return Exists([k in self.held for k in req.keys])

    async def fetch(self, hashes: Sequence[int], local: Sequence[int], size: int) -> None:
        self.reads.append(list(hashes))
        self.reading.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise LookupError("not in the tier: gone")
        for h, addr in zip(hashes, local, strict=True):
            data = block_content(h + 1 if self.wrong else h, size)
            ctypes.memmove(addr, data, size)


@pytest.fixture
async def kvbytes() -> AsyncIterator[KVBytes]:
    plane = DataPlane(DataPlaneSettings("127.0.0.1:1"), native=FakeNative)
    kb = KVBytes(plane, cache_blocks=CAP, staging_blocks=CAP, block_bytes=SIZE)
    await kb.start()
    try:
        yield kb
    finally:
        await kb.close()


def tier_io(kb: KVBytes, tier: FakeTier, cache: KVCache) -> TierIO:
    return TierIO(tier, kb, cache, get_profile("test"), lambda: 0.0)  # type: ignore[arg-type]


def resident_first(cache: KVCache, n: int) -> None:
    """The chain's first ``n`` blocks computed by an earlier request."""
    if n:
        assert cache.allocate("warm", CHAIN[:n], n) is not None
        cache.commit("warm", CHAIN[:n])
        cache.release("warm")
    cache.drain_events()


@pytest.mark.parametrize(
    ("local", "in_tier", "tier_kw", "fetched", "error"),
    [
        (0, 5, {}, 5, ""),
        (2, 5, {}, 3, ""),
        (0, 3, {}, 3, "the tier holds 3 of 5 missing blocks"),
        (0, 0, {}, 0, "the tier holds none of the missing blocks"),
        (0, 5, {"wrong": True}, 0, "received blocks have wrong bytes"),
        (0, 5, {"fail": True}, 0, "not in the tier"),
    ],
    ids=["whole-chain", "after-local-prefix", "leading-run", "none", "wrong-bytes", "read-fails"],
)
async def test_prefetch(
    kvbytes: KVBytes,
    local: int,
    in_tier: int,
    tier_kw: dict[str, Any],
    fetched: int,
    error: str,
) -> None:
    cache = KVCache(CAP, BS)
    resident_first(cache, local)
    tier = FakeTier({block_key(h) for h in CHAIN[:in_tier]}, **tier_kw)
    io = tier_io(kvbytes, tier, cache)
    got = await io.prefetch(CHAIN)
    assert (got.resident, got.fetched) == (local, fetched)
    assert error in got.error and bool(got.error) == bool(error)
    assert cache.match(CHAIN) == local + fetched
    assert cache.reserved_blocks == 0 and cache.used_blocks == local + fetched
    assert cache.protected_blocks == fetched
    events = cache.drain_events()
    if fetched:
        (ev,) = events
        assert ev.kind is KVEventKind.STORED
        assert ev.block_hashes == tuple(CHAIN[local : local + fetched])
        assert ev.parent_hash == (CHAIN[local - 1] if local else 0)
    else:
        assert events == []
    assert io.prefetched_blocks == fetched


async def test_no_room_when_the_cache_holds_protected_blocks(kvbytes: KVBytes) -> None:
    cache = KVCache(CAP, BS)
    other = block_hashes(tuple(range(CAP * BS)), BS)
    assert cache.allocate("o", other, CAP) is not None
    cache.commit("o", other)
    cache.release("o")
    cache.protect(other)
    io = tier_io(kvbytes, FakeTier({block_key(h) for h in CHAIN}), cache)
    got = await io.prefetch(CHAIN)
    assert got.fetched == 0 and "no room" in got.error
    assert cache.match(other) == CAP and cache.reserved_blocks == 0


async def test_a_request_waits_for_the_prefetch_in_flight(kvbytes: KVBytes) -> None:
    cache = KVCache(CAP, BS)
    gate = asyncio.Event()
    tier = FakeTier({block_key(h) for h in CHAIN}, gate=gate)
    io = tier_io(kvbytes, tier, cache)
    pre = asyncio.create_task(io.prefetch(CHAIN))
    await tier.reading.wait()  # the prefetch has looked the chain up and is reading
    gen = GenRequest("completion", PROMPT, 4, False, False, None, "", None, "r1")
    base = Request("r1", PROMPT, 4)
    req = asyncio.create_task(io.fetch(base, gen))
    await asyncio.sleep(0)  # one turn of the loop: the request reaches its wait
    assert not req.done() and io.prefetch_waits == 1  # waiting for the prefetch
    gate.set()
    assert (await pre).fetched == 5
    # the prefix is resident: nothing to fetch on arrival (looked up again at admission)
    assert await req == replace(base, tier_lookup=True)
    assert io.fetched_blocks == 0 and tier.reads == [CHAIN]  # one read: the prefetch's
