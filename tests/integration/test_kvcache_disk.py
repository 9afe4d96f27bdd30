"""The KV-cache tier's disk segment across a kill -9: a ``tideserve engine --role kvcache``
process with a disk segment takes blocks (``POST /kvcache/disk/put``: it pulls them over the
Transfer Engine, logs them, commits them in kvmeta), a reader fetches them back through
kvmeta (tier SSD), the process is killed with SIGKILL and started again on the same port and
directory, and the reader fetches the same bytes again, every byte checked. Variants: kvmeta
kept the segment's objects (the usual case: only the kvcache process died); kvmeta forgot
them (as after a kvmeta restart without its store: the process puts its blocks back); the
log ends in a torn record; one block's bytes were damaged on disk (that block is dropped,
the others served). And an engine offloading what it evicts onto the disk segment
(``--kvcache-disk-url``) fetches a prompt's prefix back after the kvcache process was killed
and restarted in between. These run kvmeta's servicer in this process without persistence;
the last test kills a kvmeta process that keeps its objects in Postgres (with Redis, as in
production) together with the kvcache process. The real Mooncake Transfer Engine, TCP on
loopback (the tests skip, saying why, when it cannot load).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common.dataplane.blocks import block_content, mismatched
from services.common.dataplane.disk_client import put_on_disk
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.tier import KVTier, block_key
from services.common.dataplane.transfer import Arena, DataPlane
from services.common.tokens import block_hashes, tokenize
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from tests.helpers.dataplane import metadata_url_or_skip, transfer_engine_unavailable
from tests.helpers.engines import EngineFleet
from tests.helpers.ports import free_port
from tests.helpers.waits import eventually
from tests.integration._engine_proc import engine_proc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DEP = "disk"
BLOCK = 4096
FIRST = [0x5EED_0000_0000_0000 + i for i in range(8)]
SECOND = [0x5EED_0000_0001_0000 + i for i in range(4)]
HASHES = FIRST + SECOND


@pytest.fixture(scope="module")
def metadata_url() -> Iterator[str]:
    yield from metadata_url_or_skip()


@pytest.fixture
async def kvmeta() -> AsyncIterator[tuple[ObjectMaster, str]]:
    master = ObjectMaster(lease_s=1.0)
    server = grpc.aio.server()
    add_to_server(KVMetaServicer(None, ObjectShell(master, None, time.time)), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield master, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _plane(metadata_url: str, blocks: int) -> tuple[DataPlane, Arena]:
    dp = DataPlane(DataPlaneSettings(f"127.0.0.1:{free_port()}", metadata_url))
    await dp.start()
    arena = Arena(blocks * BLOCK)
    await dp.register(arena)
    return dp, arena


async def _fetch_all(tier: KVTier, arena: Arena, hashes: list[int]) -> list[bytes]:
    await tier.fetch(hashes, [arena.base + i * BLOCK for i in range(len(hashes))], BLOCK)
    return [arena.read(i * BLOCK, BLOCK) for i in range(len(hashes))]


def _damage(disk: Path, fault: str, offset: int) -> None:
    if fault == "torn-log":
        wal = max(disk.glob("wal-*.log"))
        with wal.open("ab") as f:
            f.write(b"\x30\x00\x00\x00garbage")  # a record whose payload never made it
    elif fault == "damaged-block":
        with (disk / "blocks.dat").open("r+b") as f:
            f.seek(offset + 100)
            byte = f.read(1)
            f.seek(offset + 100)
            f.write(bytes([byte[0] ^ 0xFF]))


def _kvcache_args(disk: Path, metadata_url: str, kvmeta_address: str) -> tuple[str, ...]:
    return (
        "--role", "kvcache", "--kvcache-mib", "4", "--kvcache-disk-mib", "8",
        "--kvcache-disk-dir", str(disk), "--deployment", DEP,
        "--te-metadata-url", metadata_url, "--kvmeta-address", kvmeta_address,
    )  # fmt: skip


@pytest.mark.parametrize(
    "fault",
    ["kvmeta-kept", "kvmeta-forgot", "torn-log", "damaged-block"],
    ids=["kvmeta-kept", "kvmeta-forgot", "torn-log", "damaged-block"],
)
async def test_blocks_on_disk_survive_a_kill_9(
    tmp_path: Path, metadata_url: str, kvmeta: tuple[ObjectMaster, str], fault: str
) -> None:
    master, address = kvmeta
    disk, port = tmp_path / "disk", free_port()
    args = (*_kvcache_args(disk, metadata_url, address), "--kvcache-disk-compact-records", "5")
    channel = grpc.aio.insecure_channel(address)
    stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)
    writer, w_arena = await _plane(metadata_url, len(HASHES))
    reader, r_arena = await _plane(metadata_url, len(HASHES))
    try:
        for i, h in enumerate(HASHES):
            w_arena.write(i * BLOCK, block_content(h, BLOCK))
        addrs = [w_arena.base + i * BLOCK for i in range(len(HASHES))]
        async with aiohttp.ClientSession() as http:
            async with engine_proc(tmp_path / "state", *args, port=port) as (url, proc):
                # Two puts: the first (8 records) is compacted into a snapshot, the second
                # stays in the log's tail.
                first = await put_on_disk(http, url, writer.segment, FIRST, addrs[:8], BLOCK)
                await put_on_disk(http, url, writer.segment, SECOND, addrs[8:], BLOCK)
                segs = {s.spec.name: s.spec.tier for s in master.segments(DEP)}
                assert segs == {f"127.0.0.1:{port}": 2, f"127.0.0.1:{port}/disk": 3}
                got = await _fetch_all(KVTier(stub, reader, DEP), r_arena, HASHES)
                assert mismatched(HASHES, got) == []
                proc.send_signal(signal.SIGKILL)
                await asyncio.wait_for(proc.wait(), 30)
            assert sorted(p.name for p in disk.iterdir() if p.name.startswith("snapshot")) == [
                "snapshot.bin"
            ]
            if fault == "kvmeta-forgot":
                master.unmount_segment(DEP, f"127.0.0.1:{port}/disk", time.time())
            _damage(disk, fault, first[0])
            async with engine_proc(tmp_path / "state", *args, port=port) as (url, proc):
                async with http.get(url + "/health") as resp:
                    health: dict[str, Any] = await resp.json()
                restored = health["disk"]["restored"]
                lost = [HASHES[0]] if fault == "damaged-block" else []
                served = [h for h in HASHES if h not in lost]
                assert restored["kept"] + restored["reput"] == len(served)
                assert restored["reput"] == (len(served) if fault == "kvmeta-forgot" else 0)
                assert health["disk"]["blocks"] == len(served)
                # A fresh reader, as an engine that never saw the old process would be.
                again, a_arena = await _plane(metadata_url, len(HASHES))
                try:
                    tier = KVTier(stub, again, DEP)
                    got = await _fetch_all(tier, a_arena, served)
                    assert mismatched(served, got) == []

                    async def only_served_listed() -> bool:
                        there = master.exist(DEP, "", [block_key(h) for h in HASHES])
                        return there == [h not in lost for h in HASHES]

                    await eventually(only_served_listed)  # a damaged block is removed
                finally:
                    await again.close()
                    a_arena.close()
    finally:
        for dp, arena in ((writer, w_arena), (reader, r_arena)):
            await dp.close()
            arena.close()
        await channel.close()


LONG = " ".join(f"w{i}" for i in range(700))  # 10 full blocks of 64 tokens + a tail
OTHER = " ".join(f"v{i}" for i in range(700))


async def test_an_engine_offloads_to_disk_and_fetches_back_after_a_kill_9(
    tmp_path: Path,
    metadata_url: str,
    kvmeta: tuple[ObjectMaster, str],
    http: aiohttp.ClientSession,
) -> None:
    master, address = kvmeta
    port = free_port()
    args = _kvcache_args(tmp_path / "disk", metadata_url, address)
    fleet = EngineFleet(
        tmp_path,
        serve="runner",
        profile="test",
        speedup=20.0,
        deployment=DEP,
        kvcache_tier=True,
        kvcache_policy="offload_on_evict",
        kvcache_disk_url=f"http://127.0.0.1:{port}",
        kv_blocks=11,  # one 700-token prompt (+4 new tokens): the next one evicts it whole
        kvmeta_address=address,
        te_metadata_url=metadata_url,
    )
    try:
        async with engine_proc(tmp_path / "state", *args, port=port) as (_url, proc):
            engine, url = await fleet.start()

            async def complete(prompt: str) -> dict[str, Any]:
                body = {"prompt": prompt, "max_tokens": 4}
                async with http.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    return dict(await resp.json())

            keys = [block_key(h) for h in block_hashes(tokenize(LONG), engine.settings.block_size)]
            want = await complete(LONG)
            await complete(OTHER)  # evicts LONG's blocks: offloaded onto the disk

            async def on_disk() -> bool:
                return all(master.exist(DEP, "", keys)) and engine.core.cache.held_slots == 0

            await eventually(on_disk)
            reps, _ = master.get_replica_list(DEP, "", keys[0], time.time())
            assert reps[0].tier == 3  # SSD
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 30)
        async with engine_proc(tmp_path / "state", *args, port=port):
            assert engine.tier_io is not None
            computed = engine.core.prompt_tokens_total
            got = await complete(LONG)
            assert got["choices"][0]["text"] == want["choices"][0]["text"]
            assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 640  # fetched
            assert engine.tier_io.fetched_blocks == 10
            assert engine.core.prompt_tokens_total - computed == len(tokenize(LONG)) - 640
    finally:
        await fleet.close()


def _kvmeta_process(
    tmp: Path, grpc_port: int, meta_port: int, pg: str, rd: str
) -> subprocess.Popen[bytes]:
    """kvmeta as a process, its objects in Postgres (what it acknowledges survives it)."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIDESERVE_")}
    env.update(
        {
            "TIDESERVE_METADATA_HTTP_PORT": str(meta_port),
            "TIDESERVE_STREAM_PREFIX": f"t{uuid.uuid4().hex[:8]}",
            "TIDESERVE_LOG_FORMAT": "text",
        }
    )
    args = ["--grpc-port", str(grpc_port), "--metrics-port", "0"]
    args += ["--postgres-url", pg, "--redis-url", rd]
    with (tmp / "kvmeta.stderr").open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "services.kvmeta", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


async def _kvmeta_up(proc: subprocess.Popen[bytes], stub: Any, tmp: Path) -> None:
    async def serving() -> bool:
        assert proc.poll() is None, (tmp / "kvmeta.stderr").read_text()[-2000:]
        try:
            await stub.Exist(kvmeta_pb2.ExistRequest(deployment=DEP, keys=["probe"]))
        except grpc.aio.AioRpcError:
            return False
        return True

    await eventually(serving, within_s=60)


async def test_kvcache_and_kvmeta_both_killed_with_kvmeta_on_postgres(
    tmp_path: Path, postgres_db_url: str, redis_url: str
) -> None:
    reason = transfer_engine_unavailable()  # kvmeta serves the metadata endpoint itself here
    if reason is not None:
        pytest.skip(reason)
    gport, mport, port = free_port(), free_port(), free_port()
    meta = f"http://127.0.0.1:{mport}/metadata"
    args = _kvcache_args(tmp_path / "disk", meta, f"127.0.0.1:{gport}")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gport}")
    stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)
    kvmeta = _kvmeta_process(tmp_path, gport, mport, postgres_db_url, redis_url)
    planes: list[tuple[DataPlane, Arena]] = []
    try:
        await _kvmeta_up(kvmeta, stub, tmp_path)
        writer, w_arena = await _plane(meta, len(HASHES))
        planes.append((writer, w_arena))
        for i, h in enumerate(HASHES):
            w_arena.write(i * BLOCK, block_content(h, BLOCK))
        addrs = [w_arena.base + i * BLOCK for i in range(len(HASHES))]
        async with aiohttp.ClientSession() as http:
            async with engine_proc(tmp_path / "state", *args, port=port) as (url, proc):
                await put_on_disk(http, url, writer.segment, HASHES, addrs, BLOCK)
                proc.send_signal(signal.SIGKILL)
                kvmeta.send_signal(signal.SIGKILL)
                await asyncio.wait_for(proc.wait(), 30)
                kvmeta.wait(30)
            kvmeta = _kvmeta_process(tmp_path, gport, mport, postgres_db_url, redis_url)
            await _kvmeta_up(kvmeta, stub, tmp_path)
            async with engine_proc(tmp_path / "state", *args, port=port) as (url, _proc):
                async with http.get(url + "/health") as resp:
                    restored = (await resp.json())["disk"]["restored"]
                # kvmeta reloaded the segment and its objects from Postgres: nothing put back.
                assert (restored["kept"], restored["reput"]) == (len(HASHES), 0)
                reader, r_arena = await _plane(meta, len(HASHES))
                planes.append((reader, r_arena))
                got = await _fetch_all(KVTier(stub, reader, DEP), r_arena, HASHES)
                assert mismatched(HASHES, got) == []
    finally:
        for dp, arena in planes:
            await dp.close()
            arena.close()
        await channel.close()
        if kvmeta.poll() is None:
            kvmeta.terminate()
            kvmeta.wait(30)
