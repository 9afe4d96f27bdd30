"""The KV-cache tier over kvmeta's object master (shell): a ``kvcache`` instance mounts its
registered arena as a segment; engines store blocks into it and fetch them back over the
Transfer Engine, with kvmeta deciding where each block goes and leasing what is read.

* :meth:`KVTier.mount` / :meth:`KVTier.unmount`: ``MountSegment`` of an arena (name = the
  Transfer Engine segment, ``transfer_address`` = the same, ``base_address`` = the arena's
  address, so replica offsets are absolute addresses in it).
* :meth:`KVTier.store`: ``BatchPutStart`` (kvmeta places each block: segment + address),
  one batched Transfer Engine write per holder, ``BatchPutEnd``; on any failure every
  started key is revoked (``PutRevoke``), so nothing half-written becomes visible.
* :meth:`KVTier.fetch`: ``BatchGetReplicaList`` (which leases the objects until
  ``lease_expires_ms``), one batched read per holder. While the read runs, a *lease keeper*
  calls ``BatchGetReplicaList`` again whenever half of the remaining lease has passed, so a
  slow fetch never loses its objects to eviction or removal (Mooncake's -707 LEASE_EXPIRED).
  The keeper stops when the fetch ends, whatever its outcome.

Keys: ``kv-<16 hex digits of the block hash>``. Errors: ``grpc.aio.AioRpcError`` from kvmeta
(e.g. RESOURCE_EXHAUSTED when nothing can be evicted), ``LookupError`` for blocks not stored,
:class:`~services.common.dataplane.transfer.TransferError` from the data plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from tideserve.v1 import common_pb2, kvmeta_pb2

from services.common.dataplane.blocks import block_key
from services.common.dataplane.transfer import Arena, DataPlane, TransferError

__all__ = ["Fetched", "KVTier", "block_key"]


@dataclass(frozen=True)
class Fetched:
    """A fetch that worked: bytes moved, wall ms, and how many times the keeper renewed."""

    nbytes: int
    ms: float
    renewals: int


class KVTier:
    """``stub``: a ``KVMetaServiceStub``; ``plane``: this process's started data plane."""

    def __init__(
        self,
        stub: Any,
        plane: DataPlane,
        deployment: str,
        *,
        tenant: str = "",
        wall: Callable[[], float] = time.time,
        min_renew_s: float = 0.05,
    ) -> None:
        self.stub = stub
        self.plane = plane
        self.deployment = deployment
        self.tenant = tenant
        self.wall = wall
        self.min_renew_s = min_renew_s
        self.renewals = 0

    async def mount(
        self,
        arena: Arena,
        instance_id: str,
        tier: int = common_pb2.TIER_CPU,
        *,
        name: str = "",
        replace: bool = False,
    ) -> None:
        """Mount ``arena`` as segment ``name`` (default: the data plane's segment name).
        ``replace``: when kvmeta holds the name with another spec (this process was killed
        and restarted with its memory elsewhere), unmount that one (its objects vanish) and
        mount again; else ALREADY_EXISTS is raised."""
        seg = kvmeta_pb2.Segment(
            name=name or self.plane.segment,
            instance_id=instance_id,
            tier=tier,  # type: ignore[arg-type]
            capacity_bytes=arena.size,
            transfer_address=self.plane.segment,
            base_address=arena.base,
        )
        req = kvmeta_pb2.MountSegmentRequest(deployment=self.deployment, segment=seg)
        try:
            await self.stub.MountSegment(req)
        except grpc.aio.AioRpcError as err:
            if not replace or err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            await self.unmount(seg.name)
            await self.stub.MountSegment(req)

    async def unmount(self, name: str = "") -> None:
        await self.stub.UnmountSegment(
            kvmeta_pb2.UnmountSegmentRequest(
                deployment=self.deployment, name=name or self.plane.segment
            )
        )

    async def store(self, hashes: Sequence[int], local: Sequence[int], size: int) -> None:
        """Store the blocks at ``local[i]`` (``size`` bytes each) under ``hashes[i]``."""
        keys = [block_key(h) for h in hashes]
        res = await self.stub.BatchPutStart(
            kvmeta_pb2.BatchPutStartRequest(
                deployment=self.deployment,
                tenant=self.tenant,
                keys=keys,
                sizes=[size] * len(keys),
                # DRAM only: a disk segment is written by its own instance (it logs what it
                # holds), never directly by an engine.
                config=kvmeta_pb2.ReplicaConfig(replica_num=1, tier=common_pb2.TIER_CPU),
            )
        )
        try:
            groups: dict[str, tuple[list[int], list[int]]] = {}
            for addr, kr in zip(local, res.results, strict=True):
                for rep in kr.replicas:
                    src, dst = groups.setdefault(rep.transfer_address, ([], []))
                    src.append(addr)
                    dst.append(rep.offset)
            for peer, (src, dst) in groups.items():
                await self.plane.write(peer, src, dst, [size] * len(src))
            await self.stub.BatchPutEnd(
                kvmeta_pb2.BatchPutEndRequest(
                    deployment=self.deployment, tenant=self.tenant, keys=keys
                )
            )
        except (TransferError, grpc.aio.AioRpcError):
            for key in keys:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await self.stub.PutRevoke(
                        kvmeta_pb2.PutRevokeRequest(
                            deployment=self.deployment, tenant=self.tenant, key=key
                        )
                    )
            raise

    async def fetch(
        self, hashes: Sequence[int], local: Sequence[int], size: int, *, keep_lease: bool = True
    ) -> Fetched:
        """Read the blocks of ``hashes`` into ``local[i]``; LookupError naming the keys not
        stored (nothing read). ``keep_lease``: renew the leases until the read ends."""
        keys = [block_key(h) for h in hashes]
        res = await self._replicas(keys)
        missing = [kr.key for kr in res.results if kr.error_code or not kr.replicas]
        if missing:
            raise LookupError(f"not in the tier: {', '.join(missing)}")
        groups: dict[str, tuple[list[int], list[int]]] = {}
        for addr, kr in zip(local, res.results, strict=True):
            rep = kr.replicas[0]
            dst, src = groups.setdefault(rep.transfer_address, ([], []))
            dst.append(addr)
            src.append(rep.offset)
        before = self.renewals
        keeper = (
            asyncio.create_task(self._keep(keys, res.lease_expires_ms / 1000.0))
            if keep_lease
            else None
        )
        nbytes, ms = 0, 0.0
        try:
            for peer, (dst, src) in groups.items():
                done = await self.plane.read(peer, dst, src, [size] * len(dst))
                nbytes, ms = nbytes + done.nbytes, ms + done.ms
        finally:
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
        return Fetched(nbytes, ms, self.renewals - before)

    async def _replicas(self, keys: list[str]) -> Any:
        return await self.stub.BatchGetReplicaList(
            kvmeta_pb2.BatchGetReplicaListRequest(
                deployment=self.deployment, tenant=self.tenant, keys=keys
            )
        )

    async def _keep(self, keys: list[str], expires: float) -> None:
        """Renew the leases of ``keys`` at half of what is left of them, until cancelled."""
        while True:
            await asyncio.sleep(max(self.min_renew_s, (expires - self.wall()) / 2))
            res = await self._replicas(keys)
            expires = res.lease_expires_ms / 1000.0
            self.renewals += 1
