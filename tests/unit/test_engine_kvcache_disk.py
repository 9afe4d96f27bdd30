"""The ``kvcache`` role's disk segment (:mod:`services.engine.kvcache_disk`) against kvmeta's
real servicer and object master called in process (no network) and a Transfer Engine fake
that copies memory: a put is logged before it is committed and survives a new start; every
failure (transfer, commit, placement on another segment) revokes its keys and leaves nothing
in the index (a timed-out pull only once the native read has returned); a start puts back
what kvmeta forgot, moving the bytes to where kvmeta placed them, and drops a damaged block;
two processes cannot share a directory. And the HTTP route's statuses for each outcome of a
put."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from tideserve.v1 import common_pb2, kvmeta_pb2

from services.common.dataplane.blocks import block_content, block_key
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.tier import KVTier
from services.common.dataplane.transfer import Arena, DataPlane, TransferError, TransferTimeout
from services.engine.kvcache_disk import DiskSegment, PutRefused
from services.engine.kvcache_role import _app
from services.kvmeta.objects import ObjectMaster, SegmentSpec
from services.kvmeta.servicer import KVMetaServicer, ObjectShell
from tests.helpers.dataplane import FakeNative
from tests.helpers.waits import eventually

DEP = "d"
BLOCK = 4096
HASHES = [0xAB00 + i for i in range(3)]


class _Ctx:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class InProcessStub:
    """``KVMetaServiceStub`` calling the servicer directly; ``fail``: method → status code
    that method answers instead (a fault)."""

    def __init__(self, servicer: KVMetaServicer) -> None:
        self.servicer = servicer
        self.fail: dict[str, grpc.StatusCode] = {}

    def __getattr__(self, name: str) -> Any:
        async def call(request: Any) -> Any:
            if name in self.fail:
                await _Ctx().abort(self.fail[name], "injected")
            return await getattr(self.servicer, name)(request, _Ctx())

        return call


class FailingNative(FakeNative):
    rc = -1


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.master = ObjectMaster(lease_s=5.0)
        servicer = KVMetaServicer(None, ObjectShell(self.master, None, time.time))  # type: ignore[arg-type]
        self.stub = InProcessStub(servicer)
        self.planes: list[DataPlane] = []
        self.src = Arena(len(HASHES) * BLOCK)
        for i, h in enumerate(HASHES):
            self.src.write(i * BLOCK, block_content(h, BLOCK))

    async def segment(self, native: type[Any] = FakeNative, mib: int = 1) -> DiskSegment:
        plane = DataPlane(DataPlaneSettings("127.0.0.1:1"), native=native)
        await plane.start()
        self.planes.append(plane)
        return DiskSegment(self.tmp / "disk", mib << 20, KVTier(self.stub, plane, DEP), 2)

    def addrs(self, n: int = len(HASHES)) -> list[int]:
        return [self.src.base + i * BLOCK for i in range(n)]

    def keys(self) -> list[str]:
        return [block_key(h) for h in HASHES]

    def served(self, seg: DiskSegment) -> list[bytes]:
        """What a reader gets for each block through kvmeta's replica addresses."""
        out = []
        for key in self.keys():
            reps, _ = self.master.get_replica_list(DEP, "", key, time.time())
            arena = seg._live()
            out.append(arena.read(reps[0].offset - arena.base, BLOCK))
        return out


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        for p in w.planes:
            await p.close()
        w.src.close()


def _want() -> list[bytes]:
    return [block_content(h, BLOCK) for h in HASHES]


async def test_a_put_is_logged_and_served_after_a_new_start(world: World) -> None:
    seg = await world.segment()
    await seg.start("i")
    offsets = await seg.put("", world.keys(), BLOCK, "src:1", world.addrs())
    assert world.served(seg) == _want()
    assert [b.offset for b in seg.index.blocks()] == sorted(offsets)
    await seg.close(unmount=False)  # as a kill -9: kvmeta keeps the segment
    again = await world.segment()
    got = await again.start("i")
    assert (got.kept, got.reput, got.dropped) == (3, 0, 0)
    assert got.replay.snapshot_blocks + got.replay.wal_records >= 3  # compacted after 2
    assert world.served(again) == _want()
    await again.close(unmount=True)
    assert world.master.segments(DEP) == []


@pytest.mark.parametrize(
    ("fault", "error"),
    [("transfer", TransferError), ("commit", grpc.aio.AioRpcError)],
    ids=["transfer-fails", "put-end-fails"],
)
async def test_a_failed_put_revokes_and_holds_nothing(
    world: World, fault: str, error: type[Exception]
) -> None:
    seg = await world.segment(FailingNative if fault == "transfer" else FakeNative)
    await seg.start("i")
    if fault == "commit":
        world.stub.fail["BatchPutEnd"] = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(error):
        await seg.put("", world.keys(), BLOCK, "src:1", world.addrs())
    assert world.master.object_counts() == (0, 0)  # revoked
    assert len(seg.index) == 0
    await seg.close(unmount=False)
    again = await world.segment()
    assert (await again.start("i")).kept == 0  # nothing came back from the log either
    await again.close(unmount=True)


async def test_a_timed_out_pull_keeps_its_places_until_the_native_read_returns(
    world: World,
) -> None:
    class Held(FakeNative):
        gate = threading.Event()

    plane = DataPlane(DataPlaneSettings("127.0.0.1:1", transfer_timeout_s=0.1), native=Held)
    await plane.start()
    world.planes.append(plane)
    seg = DiskSegment(world.tmp / "disk", 1 << 20, KVTier(world.stub, plane, DEP))
    await seg.start("i")
    with pytest.raises(TransferTimeout):
        await seg.put("", world.keys(), BLOCK, "src:1", world.addrs())
    assert world.master.object_counts() == (0, 3)  # still being written: not handed out
    Held.gate.set()  # the native read returns

    async def revoked() -> bool:
        return world.master.object_counts() == (0, 0)

    await eventually(revoked)
    assert len(seg.index) == 0
    await seg.close(unmount=True)


async def test_a_put_placed_on_another_segment_is_refused(world: World) -> None:
    seg = await world.segment()
    await seg.start("i")
    other = SegmentSpec("other/disk", "j", 3, 8 << 20, "other", 0)
    world.master.mount_segment(DEP, other, time.time())
    # Fill our segment (1 MiB) with hard-pinned objects: the next put goes to "other".
    pinned = kvmeta_pb2.ReplicaConfig(
        replica_num=1, tier=common_pb2.TIER_SSD, hard_pin=True, policy="local_first"
    )
    pinned.preferred_segment = seg.name
    await world.stub.BatchPutStart(
        kvmeta_pb2.BatchPutStartRequest(
            deployment=DEP, keys=[f"fill-{i}" for i in range(256)], sizes=[BLOCK] * 256,
            config=pinned,
        )
    )  # fmt: skip
    with pytest.raises(PutRefused, match="outside"):
        await seg.put("", world.keys()[:1], BLOCK, "src:1", world.addrs(1))
    assert world.master.exist(DEP, "", world.keys()[:1]) == [False]
    await seg.close(unmount=True)


async def test_a_start_puts_back_what_kvmeta_forgot_and_drops_a_damaged_block(
    world: World,
) -> None:
    seg = await world.segment()
    await seg.start("i")
    offsets = await seg.put("", world.keys(), BLOCK, "src:1", world.addrs())
    first = min(range(3), key=lambda i: offsets[i])  # the block at the lowest offset
    seg._live().write(offsets[first] + 10, b"\xff\xff")  # damaged on disk
    await seg.close(unmount=False)
    world.master.unmount_segment(DEP, seg.name, time.time())  # kvmeta forgot
    again = await world.segment()
    got = await again.start("i")
    assert (got.kept, got.reput, got.dropped) == (0, 2, 1)
    keep = [i for i in range(3) if i != first]
    listed = world.master.exist(DEP, "", world.keys())
    assert listed == [i != first for i in range(3)]
    for i in keep:  # placed anew (first fit: the damaged block's place is reused), bytes moved
        reps, _ = world.master.get_replica_list(DEP, "", world.keys()[i], time.time())
        arena = again._live()
        assert arena.read(reps[0].offset - arena.base, BLOCK) == _want()[i]
    assert sorted(b.offset for b in again.index.blocks()) == [0, BLOCK]
    await again.close(unmount=True)


async def test_one_process_per_directory(world: World) -> None:
    seg = await world.segment()
    await seg.start("i")
    other = await world.segment()
    with pytest.raises(RuntimeError, match="used by another kvcache process"):
        await other.start("i")
    await other.close(unmount=False)
    await seg.close(unmount=True)


class FakeDisk:
    """``put`` answers ``outcome`` (offsets, or an exception to raise)."""

    def __init__(self, outcome: list[int] | BaseException) -> None:
        self.outcome = outcome

    async def put(self, *args: Any) -> list[int]:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def health(self) -> dict[str, Any]:
        return {"segment": "s/disk"}


def _rpc(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "x")


GOOD = {"keys": ["kv-1"], "size": 8, "source": "h:1", "addrs": [4096]}


@pytest.mark.parametrize(
    ("outcome", "body", "status"),
    [
        ([0], GOOD, 200),
        (None, GOOD, 404),
        ([0], "not json", 400),
        ([0], {"keys": ["kv-1"], "size": 8}, 400),
        ([0], {**GOOD, "size": "big"}, 400),
        (PutRefused("need keys"), GOOD, 400),
        (PutRefused("kvmeta placed blocks outside s/disk (it is full)"), GOOD, 507),
        (_rpc(grpc.StatusCode.RESOURCE_EXHAUSTED), GOOD, 507),
        (_rpc(grpc.StatusCode.ALREADY_EXISTS), GOOD, 409),
        (_rpc(grpc.StatusCode.INVALID_ARGUMENT), GOOD, 400),
        (_rpc(grpc.StatusCode.UNAVAILABLE), GOOD, 503),
        (TransferError("peer gone"), GOOD, 503),
    ],
    ids=[
        "ok",
        "no-disk-segment",
        "not-json",
        "missing-fields",
        "bad-size",
        "refused-request",
        "placed-elsewhere",
        "kvmeta-full",
        "already-stored",
        "kvmeta-invalid",
        "kvmeta-unavailable",
        "transfer-failed",
    ],
)
async def test_disk_put_route_statuses(outcome: Any, body: Any, status: int) -> None:
    tier = SimpleNamespace(plane=SimpleNamespace(segment="s"))
    arena = SimpleNamespace(size=1 << 20)
    disk = None if outcome is None else FakeDisk(outcome)
    async with TestClient(TestServer(_app(tier, arena, disk))) as client:  # type: ignore[arg-type]
        kw = {"data": body} if isinstance(body, str) else {"json": body}
        resp = await client.post("/kvcache/disk/put", **kw)
        got = await resp.json()
        assert resp.status == status, got
        if status == 200:
            assert got == {"offsets": outcome}
        else:
            assert got["error"]["message"]
        health = await (await client.get("/health")).json()
        assert health["disk"] == (None if disk is None else {"segment": "s/disk"})
