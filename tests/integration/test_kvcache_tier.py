"""The KV-cache tier: a ``tideserve engine --role kvcache`` process mounts a DRAM segment in
kvmeta's object master (served in this process over gRPC, no persistence); one data plane
stores blocks into it through PutStart/PutEnd, another fetches them through GetReplicaList,
and every byte is checked against the block hashes. A fetch held up past the lease keeps its
objects leased (the keeper renews), so kvmeta refuses to remove them; without the keeper the
lease lapses and the same Remove succeeds. Two engines with ``kvcache_tier``: what the first
computed is written through to the tier, and the second fetches that prefix (verified)
instead of computing it. An engine offloading on eviction stores nothing until it evicts a
prompt, then stores exactly its blocks, and fetches them back when the prompt returns. The
real Mooncake Transfer Engine, TCP on loopback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common.dataplane.blocks import block_content, mismatched
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.tier import KVTier, block_key
from services.common.dataplane.transfer import Arena, DataPlane, Transfer
from services.common.tokens import block_hashes, tokenize
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from tests.helpers.dataplane import metadata_url_or_skip
from tests.helpers.engines import EngineFleet
from tests.helpers.ports import free_port
from tests.helpers.waits import eventually
from tests.integration._engine_proc import engine_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DEP = "tier"
LEASE_S = 1.0
BLOCK = 4096
HASHES = [0x1234_5678_9ABC_DEF0 + i for i in range(12)]
LONG = " ".join(f"w{i}" for i in range(700))  # 10 full blocks of 64 tokens + a tail
OTHER = " ".join(f"v{i}" for i in range(700))


@pytest.fixture(scope="module")
def metadata_url() -> Iterator[str]:
    yield from metadata_url_or_skip()


@dataclass
class Tier:
    master: ObjectMaster
    kvmeta_address: str
    stub: Any
    writer: KVTier
    reader: KVTier
    w_arena: Arena
    r_arena: Arena


@pytest.fixture
async def tier(tmp_path: Path, metadata_url: str) -> AsyncIterator[Tier]:
    master = ObjectMaster(lease_s=LEASE_S)
    server = grpc.aio.server()
    # Only the object RPCs are used: the prefix index (feeder) is not needed.
    add_to_server(KVMetaServicer(None, ObjectShell(master, None, time.time)), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)
    planes: list[DataPlane] = []
    arenas: list[Arena] = []
    try:
        args = (
            "--role", "kvcache", "--kvcache-mib", "4", "--deployment", DEP,
            "--te-metadata-url", metadata_url, "--kvmeta-address", f"127.0.0.1:{port}",
        )  # fmt: skip
        async with engine_process(tmp_path / "kvcache", *args):
            assert [s.spec.tier for s in master.segments(DEP)] == [2]  # mounted, CPU
            tiers = []
            for _ in range(2):
                dp = DataPlane(DataPlaneSettings(f"127.0.0.1:{free_port()}", metadata_url))
                await dp.start()
                planes.append(dp)
                arena = Arena(len(HASHES) * BLOCK)
                await dp.register(arena)
                arenas.append(arena)
                tiers.append(KVTier(stub, dp, DEP))
            yield Tier(master, f"127.0.0.1:{port}", stub, tiers[0], tiers[1], arenas[0], arenas[1])
        assert master.segments(DEP) == []  # the kvcache process unmounted on SIGTERM
    finally:
        for dp in planes:
            await dp.close()
        for arena in arenas:
            arena.close()
        await channel.close()
        await server.stop(None)


def _addrs(arena: Arena) -> list[int]:
    return [arena.base + i * BLOCK for i in range(len(HASHES))]


async def _store(t: Tier) -> None:
    for i, h in enumerate(HASHES):
        t.w_arena.write(i * BLOCK, block_content(h, BLOCK))
    await t.writer.store(HASHES, _addrs(t.w_arena), BLOCK)


def _received(t: Tier) -> list[bytes]:
    return [t.r_arena.read(i * BLOCK, BLOCK) for i in range(len(HASHES))]


async def test_blocks_go_through_the_tier_with_checksums(tier: Tier) -> None:
    await _store(tier)
    assert tier.master.exist(DEP, "", [block_key(h) for h in HASHES]) == [True] * len(HASHES)
    assert sum(s.used_bytes for s in tier.master.segments(DEP)) == len(HASHES) * BLOCK
    got = await tier.reader.fetch(HASHES, _addrs(tier.r_arena), BLOCK)
    assert got.nbytes == len(HASHES) * BLOCK
    assert mismatched(HASHES, _received(tier)) == []
    with pytest.raises(LookupError, match="not in the tier"):
        await tier.reader.fetch([42], _addrs(tier.r_arena)[:1], BLOCK)


class HeldPlane:
    """The reader's data plane with every read held until ``go`` is set (a slow fetch)."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane, self.segment, self.go = plane, plane.segment, asyncio.Event()

    async def read(self, *args: Any, **kw: Any) -> Transfer:
        await self.go.wait()
        return await self.plane.read(*args, **kw)


async def _remove(t: Tier) -> grpc.StatusCode:
    try:
        await t.stub.Remove(kvmeta_pb2.RemoveRequest(deployment=DEP, key=block_key(HASHES[0])))
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("keep", [True, False], ids=["keeper-renews", "no-keeper-lapses"])
async def test_lease_across_a_slow_fetch(tier: Tier, keep: bool) -> None:
    await _store(tier)
    held = HeldPlane(tier.reader.plane)
    slow = KVTier(tier.stub, held, DEP)  # type: ignore[arg-type]
    fetch = asyncio.create_task(slow.fetch(HASHES, _addrs(tier.r_arena), BLOCK, keep_lease=keep))
    first = time.time()

    async def lease_would_have_lapsed() -> bool:
        return time.time() > first + 2.5 * LEASE_S

    await eventually(lease_would_have_lapsed)
    assert not fetch.done()  # still held
    if keep:
        assert slow.renewals >= 2
        assert await _remove(tier) == grpc.StatusCode.FAILED_PRECONDITION  # still leased
        held.go.set()
        got = await asyncio.wait_for(fetch, 30)
        assert got.renewals >= 2 and mismatched(HASHES, _received(tier)) == []
    else:
        assert await _remove(tier) == grpc.StatusCode.OK  # the lease lapsed: removable
        held.go.set()
        await asyncio.wait_for(fetch, 30)


def _tier_fleet(tier: Tier, tmp_path: Path, metadata_url: str, **kw: Any) -> EngineFleet:
    """Engines (run as ``tideserve engine`` serves) with the tier of ``tier``."""
    return EngineFleet(
        tmp_path,
        serve="runner",
        profile="test",
        speedup=20.0,
        deployment=DEP,
        kvcache_tier=True,
        kvmeta_address=tier.kvmeta_address,
        te_metadata_url=metadata_url,
        **kw,
    )


@pytest.mark.parametrize("role", ["aggregated", "prefill"], ids=["aggregated", "pd-prefill"])
async def test_engine_fetches_what_another_engine_wrote_through(
    tier: Tier, tmp_path: Path, metadata_url: str, http: aiohttp.ClientSession, role: str
) -> None:
    fleet = _tier_fleet(tier, tmp_path, metadata_url)
    try:
        first, furl = await fleet.start()
        second, surl = await fleet.start(role=role)
        body: dict[str, Any] = {"prompt": LONG, "max_tokens": 4}
        async with http.post(furl + "/v1/completions", json=body) as resp:
            want = await resp.json()
        if role == "prefill":  # SGLang P/D: the prefill computes the first token only
            port = int(surl.rsplit(":", 1)[1])
            body.update(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=5)
        keys = [block_key(h) for h in block_hashes(tokenize(LONG), first.settings.block_size)]
        assert len(keys) == 10

        async def written_through() -> bool:
            return all(tier.master.exist(DEP, "", keys))

        await eventually(written_through)
        async with http.post(surl + "/v1/completions", json=body) as resp:
            got = await resp.json()
        if role == "aggregated":
            assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 640  # fetched
        assert second.tier_io is not None and second.tier_io.fetched_blocks == 10
        assert second.core.prompt_tokens_total == len(tokenize(LONG)) - 640
    finally:
        await fleet.close()


async def test_engine_offloads_what_it_evicts_and_fetches_it_back(
    tier: Tier, tmp_path: Path, metadata_url: str, http: aiohttp.ClientSession
) -> None:
    fleet = _tier_fleet(
        tier,
        tmp_path,
        metadata_url,
        kvcache_policy="offload_on_evict",
        kv_blocks=11,  # one 700-token prompt (+4 new tokens): the next one evicts it whole
    )
    try:
        engine, url = await fleet.start()
        assert engine.tier_io is not None

        async def complete(prompt: str) -> dict[str, Any]:
            async with http.post(
                url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}
            ) as resp:
                assert resp.status == 200
                return dict(await resp.json())

        bs = engine.settings.block_size
        keys = [block_key(h) for h in block_hashes(tokenize(LONG), bs)]
        want = await complete(LONG)
        assert not any(tier.master.exist(DEP, "", keys))  # computed, cached, not stored
        await complete(OTHER)  # evicts LONG's blocks: offloaded

        async def offloaded() -> bool:
            return all(tier.master.exist(DEP, "", keys)) and engine.core.cache.held_slots == 0

        await eventually(offloaded)
        other = [block_key(h) for h in block_hashes(tokenize(OTHER), bs)]
        assert not any(tier.master.exist(DEP, "", other))  # resident: not stored
        assert engine.tier_io.stored_blocks == len(keys) == 10
        computed = engine.core.prompt_tokens_total
        got = await complete(LONG)
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 640  # fetched back
        assert engine.tier_io.fetched_blocks == 10
        assert engine.core.prompt_tokens_total - computed == len(tokenize(LONG)) - 640
    finally:
        await fleet.close()


async def test_prefix_evicted_while_the_turn_waited_is_fetched_at_admission(
    tier: Tier, tmp_path: Path, metadata_url: str, http: aiohttp.ClientSession
) -> None:
    """LONG is resident when its turn arrives, so nothing is fetched at submission; OTHER,
    queued ahead of it, evicts it (offloaded) while it waits: the engine asks the tier
    again when it admits the turn and fetches the prefix instead of recomputing it."""
    fleet = _tier_fleet(
        tier, tmp_path, metadata_url, kvcache_policy="offload_on_evict", kv_blocks=11
    )
    try:
        engine, url = await fleet.start()
        assert engine.tier_io is not None

        async def complete(prompt: str) -> dict[str, Any]:
            async with http.post(
                url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}
            ) as resp:
                assert resp.status == 200
                return dict(await resp.json())

        want = await complete(LONG)
        computed = engine.core.prompt_tokens_total
        engine.faults.stall_until = time.monotonic() + 120  # queue both, admit neither

        def queued(n: int) -> Callable[[], Awaitable[bool]]:
            async def pred() -> bool:
                return engine.core.num_waiting == n

            return pred

        other = asyncio.create_task(complete(OTHER))
        await eventually(queued(1))
        turn = asyncio.create_task(complete(LONG))
        await eventually(queued(2))
        assert engine.tier_io.fetched_blocks == 0  # resident at submission: nothing fetched
        engine.faults.stall_until = 0.0
        await other
        got = await turn
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 640  # fetched
        assert engine.tier_io.fetched_blocks == 10
        assert engine.tier_io.stored_blocks == 20  # LONG's, then OTHER's (evicted for it)
        long_tokens = len(tokenize(LONG))
        assert (
            engine.core.prompt_tokens_total - computed == len(tokenize(OTHER)) + long_tokens - 640
        )
    finally:
        await fleet.close()


async def test_scaled_in_session_follows_to_its_next_engine(
    tier: Tier, tmp_path: Path, metadata_url: str, http: aiohttp.ClientSession
) -> None:
    """Scale-in is drain and migrate: kvmeta's ``MigrateSessions`` tells the victim engine to
    offload its session's chain to the tier, re-homes the session on the engine that stays
    and has it fetch that prefix at once, so its next turn finds it resident."""
    fleet = _tier_fleet(tier, tmp_path, metadata_url, kvcache_policy="offload_on_evict")
    try:
        victim, vurl = await fleet.start(instance_id="e0")
        dest, durl = await fleet.start(instance_id="e1")
        assert dest.tier_io is not None

        async def complete(url: str) -> dict[str, Any]:
            body = {"prompt": LONG, "max_tokens": 4}
            async with http.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                return dict(await resp.json())

        want = await complete(vurl)
        chain = block_hashes(tokenize(LONG), victim.settings.block_size)
        key = {"deployment": DEP, "tenant": "", "session_id": "s"}
        await tier.stub.StartSessionTurn(
            kvmeta_pb2.StartSessionTurnRequest(**key, home_instance="e0")
        )
        await tier.stub.EndSessionTurn(
            kvmeta_pb2.EndSessionTurnRequest(
                **key, tip_block_hash=chain[-1], home_instance="e0", block_hashes=chain
            )
        )
        got = await tier.stub.MigrateSessions(
            kvmeta_pb2.MigrateSessionsRequest(
                deployment=DEP, instance_id="e0", url=vurl,
                destinations=[kvmeta_pb2.MigrationDestination(instance_id="e1", url=durl)],
            )
        )  # fmt: skip
        (moved,) = got.sessions
        assert (moved.fate, moved.instance_id, moved.blocks) == (
            kvmeta_pb2.MIGRATION_FATE_MOVE, "e1", 10
        )  # fmt: skip
        assert (got.offloaded, got.offloads_to_tier, got.engine_detail) == (10, True, "")
        # kvmeta answered once the victim had stored them: the instance may go now
        assert got.offload_settled
        keys = [block_key(h) for h in chain]
        assert all(tier.master.exist(DEP, "", keys))
        assert victim.core.cache.held_slots == 0
        s = (await tier.stub.GetAgentSession(kvmeta_pb2.GetAgentSessionRequest(**key))).session
        assert (s.home_instance, [(t.tier, t.blocks) for t in s.tiers]) == ("e1", [(2, 10)])
        assert got.prefetch_started == 1  # the destination fetches the prefix now

        async def prefetched() -> bool:
            return dest.core.cache.match(chain) == len(chain)

        await eventually(prefetched)
        assert dest.tier_io.prefetched_blocks == 10
        computed = dest.core.prompt_tokens_total
        again = await complete(durl)  # the session's next turn, on the engine that stays
        assert again["choices"][0]["text"] == want["choices"][0]["text"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 640  # resident
        assert dest.tier_io.fetched_blocks == 0  # nothing left to fetch at admission
        assert dest.core.prompt_tokens_total - computed == len(tokenize(LONG)) - 640
    finally:
        await fleet.close()
