"""The disk segment of a ``kvcache`` instance (shell; ``--kvcache-disk-mib``,
``--kvcache-disk-dir``).

Beside its DRAM segment, the instance maps ``blocks.dat`` in the disk directory
(:class:`~services.common.dataplane.disk_store.FileArena`), registers it with its Transfer Engine
and mounts it in kvmeta's object master as an SSD-tier segment named ``<segment>/disk``.
Readers fetch its blocks like any others (:meth:`KVTier.fetch`): the Transfer Engine reads
the mapping, the page cache serving hot blocks and the disk the rest.

Writes go through the instance (:meth:`DiskSegment.put`, ``POST /kvcache/disk/put``), never
straight from an engine, because the instance must log what it holds before the put is
acknowledged: ``BatchPutStart`` (tier SSD, this segment) → the instance pulls the blocks
from the writer's memory over the Transfer Engine into the mapping → CRC-32 of each block,
``msync`` of their pages → the log records, fsynced → ``BatchPutEnd``. Once the caller has
its answer the block survives a crash of the process (kill -9) and of the machine. On any
failure every key is revoked; after a pull that timed out, only once the native read has
returned (it may still write into the places kvmeta gave).

At start (:meth:`DiskSegment.start`): replay the snapshot and log, mount (replacing a stale
mount of the same name), check each held block's CRC-32, ask kvmeta which it lists at their
place (``BatchGetReplicaList``), and apply :func:`~services.common.dataplane.disk_index.reconcile`:
kept blocks are served at once; blocks kvmeta forgot are put again (kvmeta may place them
elsewhere: their bytes are read first, then written to their new places); the others are
dropped (a damaged block kvmeta still lists is also removed from kvmeta).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from tideserve.v1 import common_pb2, kvmeta_pb2

from services.common.dataplane.disk_index import DiskBlock, DiskIndex, Drop, Put, reconcile
from services.common.dataplane.disk_store import DiskLog, FileArena, Replay
from services.common.dataplane.tier import KVTier
from services.common.dataplane.transfer import TransferTimeout

__all__ = ["DiskSegment", "PutRefused", "Restored"]

log = logging.getLogger(__name__)


class PutRefused(ValueError):
    """A put this segment cannot take (bad request, or kvmeta placed it elsewhere)."""


@dataclass(frozen=True)
class Restored:
    """What a start found: blocks kept as kvmeta listed them, put again, dropped."""

    replay: Replay
    kept: int
    reput: int
    dropped: int
    stable_address: bool


class DiskSegment:
    def __init__(self, root: Path, size: int, tier: KVTier, compact_after: int = 4096) -> None:
        self.root = root
        self.size = size
        self.tier = tier
        self.name = f"{tier.plane.segment}/disk"
        self.compact_after = compact_after
        self._lock = asyncio.Lock()  # orders log appends, index changes, compactions
        self._log: DiskLog | None = None
        self._arena: FileArena | None = None
        self._lockfile: int | None = None
        self.index = DiskIndex()
        self.restored: Restored | None = None
        self._lease_end = 0.0  # wall time (s) when the leases taken by the start's listing end
        self._cleanup: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()  # revokes after timed-out reads

    # -- start / stop ---------------------------------------------------------------------
    async def start(self, instance_id: str) -> Restored:
        """Open the files, register and mount the segment, reconcile with kvmeta."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._lockfile = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"{self.root} is used by another kvcache process") from None
        self._log, self.index, replay = await asyncio.to_thread(DiskLog.open, self.root)
        self._arena = await asyncio.to_thread(FileArena, self.root / "blocks.dat", self.size)
        await self.tier.plane.register(self._arena)
        await self.tier.mount(
            self._arena, instance_id, common_pb2.TIER_SSD, name=self.name, replace=True
        )
        held = self.index.blocks()
        intact = await asyncio.to_thread(self._intact, held)
        listed = await self._listed(held)
        plan = reconcile(held, intact, listed)
        async with self._lock:
            await self._append([Drop(b.tenant, b.key) for b in plan.drop])
        bad = [b for b, ok, there in zip(held, intact, listed, strict=True) if there and not ok]
        if bad:  # kvmeta lists bytes that are wrong: take them out once our lease ends
            self._cleanup = asyncio.create_task(self._remove_later(bad, self._lease_end))
        reput = await self._reput(plan.reput)
        self.restored = Restored(
            replay, len(plan.keep), reput, len(held) - len(plan.keep) - reput, self._arena.stable
        )
        log.info("disk segment %s: %s", self.name, self.restored)
        return self.restored

    async def _remove_later(self, blocks: list[DiskBlock], lease_end: float) -> None:
        """Remove ``blocks`` from kvmeta once the listing's read lease has ended (kvmeta
        refuses to remove a leased object); retried while a reader holds a lease."""
        pending = list(blocks)
        await asyncio.sleep(max(0.0, lease_end - time.time()))
        for _ in range(30):
            left = []
            for b in pending:
                try:
                    await self.tier.stub.Remove(
                        kvmeta_pb2.RemoveRequest(
                            deployment=self.tier.deployment, tenant=b.tenant, key=b.key
                        )
                    )
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        left.append(b)
            if not left:
                return
            pending = left
            await asyncio.sleep(1.0)
        log.warning("could not remove %d damaged blocks from kvmeta", len(pending))

    async def close(self, *, unmount: bool) -> None:
        for task in [*self._background, *([self._cleanup] if self._cleanup else [])]:
            task.cancel()  # kvmeta reclaims puts left unended after its put timeout
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if unmount:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.tier.unmount(self.name)
        if self._log is not None:
            self._log.close()
        if self._arena is not None:
            self._arena.close()
        if self._lockfile is not None:
            os.close(self._lockfile)

    def health(self) -> dict[str, Any]:
        return {
            "segment": self.name,
            "capacity_bytes": self.size,
            "blocks": len(self.index),
            "used_bytes": self.index.used(),
            "restored": None
            if self.restored is None
            else {
                "kept": self.restored.kept,
                "reput": self.restored.reput,
                "dropped": self.restored.dropped,
                "stable_address": self.restored.stable_address,
            },
        }

    # -- puts -----------------------------------------------------------------------------
    async def put(
        self, tenant: str, keys: Sequence[str], size: int, source: str, addrs: Sequence[int]
    ) -> list[int]:
        """Store ``size``-byte blocks read from ``addrs`` in Transfer Engine segment
        ``source`` under ``keys``; returns their offsets once durable and committed."""
        if not keys or len(keys) != len(addrs) or size <= 0 or not source:
            raise PutRefused("need keys, as many addrs, a positive size and a source")
        keys = list(keys)
        offsets = await self._start(tenant, keys, size)
        try:
            arena = self._live()
            await self.tier.plane.read(
                source, [arena.base + o for o in offsets], list(addrs), [size] * len(keys)
            )
            blocks = await asyncio.to_thread(self._seal, tenant, keys, offsets, size)
            async with self._lock:
                await self._append([Put(b) for b in blocks])
            await self._end(tenant, keys)
        except TransferTimeout as err:
            # The native read may still write into these places: kvmeta must not hand them
            # out again before it has returned, so the keys are revoked only then.
            task = asyncio.create_task(self._revoke_after(err.pending, tenant, keys))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise
        except BaseException:
            await self._revoke(tenant, keys)
            raise
        return offsets

    async def _revoke_after(
        self, pending: asyncio.Future[Any], tenant: str, keys: list[str]
    ) -> None:
        with contextlib.suppress(Exception):
            await pending
        await self._revoke(tenant, keys)

    async def _start(self, tenant: str, keys: Sequence[str], size: int) -> list[int]:
        res = await self.tier.stub.BatchPutStart(
            kvmeta_pb2.BatchPutStartRequest(
                deployment=self.tier.deployment,
                tenant=tenant,
                keys=list(keys),
                sizes=[size] * len(keys),
                config=kvmeta_pb2.ReplicaConfig(
                    replica_num=1,
                    tier=common_pb2.TIER_SSD,
                    policy="local_first",
                    preferred_segment=self.name,
                ),
            )
        )
        reps = [kr.replicas[0] if len(kr.replicas) == 1 else None for kr in res.results]
        if any(r is None or r.segment != self.name for r in reps):
            await self._revoke(tenant, keys)
            raise PutRefused(f"kvmeta placed blocks outside {self.name} (it is full)")
        base = self._live().base
        return [r.offset - base for r in reps if r is not None]

    async def _end(self, tenant: str, keys: Sequence[str]) -> None:
        await self.tier.stub.BatchPutEnd(
            kvmeta_pb2.BatchPutEndRequest(
                deployment=self.tier.deployment, tenant=tenant, keys=list(keys)
            )
        )

    async def _revoke(self, tenant: str, keys: Sequence[str]) -> None:
        async with self._lock:
            await self._append(
                [Drop(tenant, k) for k in keys if self.index.get(tenant, k) is not None]
            )
        for key in keys:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.tier.stub.PutRevoke(
                    kvmeta_pb2.PutRevokeRequest(
                        deployment=self.tier.deployment, tenant=tenant, key=key
                    )
                )

    async def _reput(self, blocks: list[DiskBlock]) -> int:
        """Put ``blocks`` again, per tenant; returns how many were committed."""
        by_tenant: dict[str, list[DiskBlock]] = {}
        for b in blocks:
            by_tenant.setdefault(b.tenant, []).append(b)
        arena, done = self._live(), 0
        for tenant, group in by_tenant.items():
            data = [arena.read(b.offset, b.size) for b in group]  # before any is overwritten
            keys = [b.key for b in group]
            try:
                for size in sorted({b.size for b in group}):
                    same = [i for i, b in enumerate(group) if b.size == size]
                    offsets = await self._start(tenant, [keys[i] for i in same], size)
                    for i, off in zip(same, offsets, strict=True):
                        arena.write(off, data[i])
                    sealed = await asyncio.to_thread(
                        self._seal, tenant, [keys[i] for i in same], offsets, size
                    )
                    async with self._lock:
                        await self._append([Put(b) for b in sealed])
                    await self._end(tenant, [keys[i] for i in same])
                    done += len(same)
            except (grpc.aio.AioRpcError, PutRefused) as err:
                log.warning(
                    "could not put back %d blocks of tenant %r: %s", len(group), tenant, err
                )
                async with self._lock:
                    gone = [b for b in group if self.index.get(tenant, b.key) == b]
                    await self._append([Drop(tenant, b.key) for b in gone])
        return done

    # -- files ----------------------------------------------------------------------------
    async def _append(self, records: list[Put | Drop]) -> None:
        """Log ``records`` (fsync) and apply them; compact when the log is long. Hold
        ``self._lock``."""
        wal = self._live_log()
        if not records:
            return
        await asyncio.to_thread(wal.append, records)
        for r in records:
            self.index.apply(r)
        if wal.records >= self.compact_after:
            await asyncio.to_thread(wal.compact, self.index)

    def _seal(
        self, tenant: str, keys: Sequence[str], offsets: Sequence[int], size: int
    ) -> list[DiskBlock]:
        """Checksum the blocks in place and flush their pages to the disk."""
        arena = self._live()
        blocks = [
            DiskBlock(tenant, k, o, size, zlib.crc32(arena.view(o, size)))
            for k, o in zip(keys, offsets, strict=True)
        ]
        arena.flush([(o, size) for o in offsets])
        return blocks

    def _intact(self, held: Sequence[DiskBlock]) -> list[bool]:
        arena = self._live()
        return [
            b.end <= arena.size and zlib.crc32(arena.view(b.offset, b.size)) == b.crc for b in held
        ]

    async def _listed(self, held: Sequence[DiskBlock]) -> list[bool]:
        """Which held blocks kvmeta lists as committed at their place in this segment
        (``BatchGetReplicaList``: its short read lease is harmless here)."""
        by_tenant: dict[str, list[int]] = {}
        for i, b in enumerate(held):
            by_tenant.setdefault(b.tenant, []).append(i)
        out = [False] * len(held)
        base = self._live().base
        for tenant, idx in by_tenant.items():
            res = await self.tier.stub.BatchGetReplicaList(
                kvmeta_pb2.BatchGetReplicaListRequest(
                    deployment=self.tier.deployment, tenant=tenant, keys=[held[i].key for i in idx]
                )
            )
            self._lease_end = max(self._lease_end, res.lease_expires_ms / 1000.0)
            for i, kr in zip(idx, res.results, strict=True):
                out[i] = not kr.error_code and any(
                    r.segment == self.name and r.offset == base + held[i].offset
                    for r in kr.replicas
                )
        return out

    def _live(self) -> FileArena:
        if self._arena is None:
            raise RuntimeError("the disk segment is not started")
        return self._arena

    def _live_log(self) -> DiskLog:
        if self._log is None:
            raise RuntimeError("the disk segment is not started")
        return self._log
