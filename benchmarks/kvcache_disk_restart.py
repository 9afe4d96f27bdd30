"""How long a ``kvcache`` instance with a disk segment takes to serve its blocks again after a
kill -9, and what the durable put costs. Prints JSON.

One kvmeta process (object master + the Transfer Engine's metadata endpoint, in memory), one
``tideserve engine --role kvcache --kvcache-disk-mib``, and a writer/reader Transfer Engine in
this process. The writer puts ``--blocks`` blocks of ``--block-kib`` KiB on the disk segment
in batches of ``--batch`` (each batch: pulled by the instance, CRC-32, msync, one fsync of
the log, committed in kvmeta). Then, per variant, the instance is killed with SIGKILL and
started again on the same port and directory:

- ``kvcache_killed``: only the instance died; kvmeta still lists its blocks;
- ``kvmeta_forgot``: kvmeta was restarted too (without a store, so it forgot the blocks):
  the instance puts them all back.

``tier_restart_s``: from spawning the new process until a fetch of every block through
kvmeta (verified, byte for byte) has succeeded: the sessions' KV is served again.
``health_s``: until its ``/health`` answers (mounted, reconciled); ``first_fetch_s``: until
the first batch of ``--batch`` blocks was fetched and verified. All include the
interpreter's start (~1-2 s of imports). The block file is in the page cache (it was just
written), so the restart reads it from memory; a cold cache adds one read of the held bytes
at the disk's speed (the CRC check reads every held block).

    .venv/bin/python benchmarks/kvcache_disk_restart.py  # 4096 x 32 KiB = 128 MiB
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._dataplane import wait_metadata
from benchmarks._harness import (
    Child,
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    machine,
    tideserve,
)
from services.common.dataplane.blocks import block_content, mismatched
from services.common.dataplane.disk_client import put_on_disk
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.tier import KVTier
from services.common.dataplane.transfer import Arena, DataPlane

DEP = "diskbench"


async def _until_healthy(http: aiohttp.ClientSession, url: str, child: Child) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        if child.proc.poll() is not None:
            raise RuntimeError(f"kvcache exited {child.proc.returncode}:\n{child.tail()}")
        try:
            async with http.get(url + "/health") as resp:
                if resp.status == 200:
                    return time.monotonic()
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.02)
    raise RuntimeError("kvcache did not become healthy")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.group = ProcGroup(work)
        self.block = args.block_kib << 10
        self.hashes = [0xD15C_0000_0000_0000 + i for i in range(args.blocks)]
        self.kport, self.gport, self.mport = free_port(), free_port(), free_port()
        self.kvmeta: Child | None = None
        self.kvcache: Child | None = None

    def start_kvmeta(self) -> None:
        env = {
            "TIDESERVE_GRPC_PORT": str(self.gport),
            "TIDESERVE_METRICS_PORT": "0",
            "TIDESERVE_METADATA_HTTP_PORT": str(self.mport),
            "TIDESERVE_LOG_FORMAT": "text",
        }
        self.kvmeta = self.group.start("kvmeta", [sys.executable, "-m", "services.kvmeta"], env)
        wait_metadata(self.meta, self.group)

    @property
    def meta(self) -> str:
        return f"http://127.0.0.1:{self.mport}/metadata"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.kport}"

    def start_kvcache(self) -> Child:
        a = self.args
        self.kvcache = self.group.start(
            "kvcache",
            tideserve("engine", "--role", "kvcache", "--port", str(self.kport),
                      "--kvcache-mib", "16", "--kvcache-disk-mib", str(a.disk_mib),
                      "--kvcache-disk-dir", str(self.work / "disk"), "--deployment", DEP,
                      "--te-metadata-url", self.meta, "--kvmeta-address",
                      f"127.0.0.1:{self.gport}", "--log-level", "WARNING"),
        )  # fmt: skip
        return self.kvcache

    def kill(self, child: Child | None) -> None:
        assert child is not None
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait()
        child.handle.close()
        self.group.children.remove(child)


async def _plane(meta: str, size: int) -> tuple[DataPlane, Arena]:
    dp = DataPlane(DataPlaneSettings(f"127.0.0.1:{free_port()}", meta))
    await dp.start()
    arena = Arena(size)
    await dp.register(arena)
    return dp, arena


async def _verified_fetch(b: Bench, stub: Any, meta: str) -> float:
    """Fetch every block through kvmeta with a fresh reader and check every byte; returns
    when (monotonic) the first batch was in hand, verified."""
    reader, arena = await _plane(meta, b.args.batch * b.block)
    first = 0.0
    try:
        tier = KVTier(stub, reader, DEP)
        for i in range(0, len(b.hashes), b.args.batch):
            part = b.hashes[i : i + b.args.batch]
            await tier.fetch(part, [arena.base + j * b.block for j in range(len(part))], b.block)
            got = [arena.read(j * b.block, b.block) for j in range(len(part))]
            if mismatched(part, got):
                raise RuntimeError("fetched bytes differ")
            first = first or time.monotonic()
    finally:
        await reader.close()
        arena.close()
    return first


async def _fill(b: Bench, http: aiohttp.ClientSession) -> dict[str, Any]:
    """Put every block on the disk, ``--batch`` at a time; the put figures."""
    args = b.args
    writer, w_arena = await _plane(b.meta, args.batch * b.block)
    put_ms: list[float] = []
    try:
        for i in range(0, len(b.hashes), args.batch):
            part = b.hashes[i : i + args.batch]
            for j, h in enumerate(part):  # contents of this batch's blocks
                w_arena.write(j * b.block, block_content(h, b.block))
            addrs = [w_arena.base + j * b.block for j in range(len(part))]
            t = time.perf_counter()
            await put_on_disk(http, b.url, writer.segment, part, addrs, b.block)
            put_ms.append((time.perf_counter() - t) * 1000)
    finally:
        await writer.close()
        w_arena.close()
    return {
        "put_batch_ms": {
            "p50": statistics.median(put_ms),
            "max": max(put_ms),
            "blocks_per_batch": args.batch,
        },
        "put_mib_per_s": len(b.hashes) * b.block / 2**20 / (sum(put_ms) / 1000),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    b = Bench(args, Path(tempfile.mkdtemp(prefix="kvcache_disk_restart_")))
    out: dict[str, Any] = {"variants": {}}
    try:
        b.start_kvmeta()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
            await _until_healthy(http, b.url, b.start_kvcache())
            out.update(await _fill(b, http))
            for variant in ("kvcache_killed", "kvmeta_forgot"):
                b.kill(b.kvcache)
                if variant == "kvmeta_forgot":
                    b.kill(b.kvmeta)
                    b.start_kvmeta()
                t0 = time.monotonic()
                child = b.start_kvcache()
                healthy = await _until_healthy(http, b.url, child)
                async with grpc.aio.insecure_channel(f"127.0.0.1:{b.gport}") as ch:
                    from tideserve.v1 import kvmeta_pb2_grpc

                    stub = kvmeta_pb2_grpc.KVMetaServiceStub(ch)
                    first = await _verified_fetch(b, stub, b.meta)
                served = time.monotonic()
                async with http.get(b.url + "/health") as resp:
                    restored = (await resp.json())["disk"]["restored"]
                out["variants"][variant] = {
                    "health_s": healthy - t0,
                    "first_fetch_s": first - t0,
                    "tier_restart_s": served - t0,
                    "restored": restored,
                }
    finally:
        b.group.stop()
        shutil.rmtree(b.work / "disk", ignore_errors=True)  # the block file; logs stay
    out["tier_restart_s"] = out["variants"]["kvcache_killed"]["tier_restart_s"]
    out["config"] = {
        "blocks": args.blocks,
        "block_kib": args.block_kib,
        "held_mib": args.blocks * b.block / 2**20,
        "disk_mib": args.disk_mib,
    }
    out["command"] = command_line()
    out["machine"] = machine()
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--blocks", type=int, default=4096)
    p.add_argument("--block-kib", type=int, default=32, help="32 KiB: the engine's default")
    p.add_argument("--batch", type=int, default=64, help="blocks per put (one log fsync)")
    p.add_argument("--disk-mib", type=int, default=256)
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.blocks * args.block_kib > args.disk_mib * 1024 * 0.9:
        raise SystemExit("--disk-mib too small for --blocks x --block-kib (kvmeta's watermark)")
    emit_json(asyncio.run(run(args)), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
