"""gRPC servicer of ``tideserve.v1.KVMetaService``: a thin translation layer.

Protobuf ⇄ pure cores (``PrefixIndex`` through ``IndexFeeder``, ``ObjectMaster``, the
session table through :class:`~services.kvmeta.session_rpc.SessionRpcs`). Domain
errors become status codes (``ObjectError.code``); mutating object calls reply only after
their rows were written to Postgres (when configured), in the order they were applied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias, TypeVar

import grpc
from redis.exceptions import RedisError
from tideserve.v1 import events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common.dataplane.blocks import block_key
from services.common.sessions import SessionTable
from services.kvmeta.checkpoint import KVMetaStore
from services.kvmeta.fetchable import leading_run, with_fetchable
from services.kvmeta.index import InstanceMatch, UnknownDeploymentError, Verdict
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.migrate import SessionMigrator
from services.kvmeta.objects import (
    ObjectError,
    ObjectMaster,
    ReplicaConfig,
    ReplicaInfo,
    SegmentSpec,
)
from services.kvmeta.rpc_errors import persisted
from services.kvmeta.session_rpc import SessionRpcs
from services.kvmeta.sessions import SessionShell
from services.kvmeta.writethrough import WriteThrough

__all__ = ["SERVICE_NAME", "KVMetaServicer", "ObjectShell", "add_to_server"]

SERVICE_NAME: str = kvmeta_pb2.DESCRIPTOR.services_by_name["KVMetaService"].full_name
"""Full gRPC name, ``tideserve.v1.KVMetaService`` (health and reflection use it)."""

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = kvmeta_pb2_grpc.KVMetaServiceServicer

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
MatchResponse: TypeAlias = kvmeta_pb2.MatchPrefixResponse
T = TypeVar("T")


class ObjectShell:
    """The object master plus write-through persistence (one writer at a time, in order)."""

    def __init__(self, master: ObjectMaster, store: KVMetaStore | None, wall: Callable[[], float]):
        self.master = master
        self._store = store
        self._wall = wall
        self.persist = WriteThrough(
            master.drain_changes,
            master.requeue_changes,
            store.save_changes if store is not None else None,
        )

    def now(self) -> float:
        return self._wall()

    async def load(self) -> None:
        if self._store is not None:
            segments, objects = await self._store.load_objects()
            self.master.load(segments, objects)

    async def tick(self) -> None:
        self.master.tick(self._wall())
        await self.persist()


async def _abort(context: Ctx, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # pragma: no cover


def _code(err: ObjectError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, err.code, grpc.StatusCode.INTERNAL)


def _replica(r: ReplicaInfo) -> kvmeta_pb2.Replica:
    return kvmeta_pb2.Replica(
        segment=r.segment,
        transfer_address=r.transfer_address,
        tier=r.tier,  # type: ignore[arg-type]
        offset=r.offset,
        size=r.size,
        status=r.status,
    )


def _config(c: kvmeta_pb2.ReplicaConfig) -> ReplicaConfig:
    return ReplicaConfig(
        replica_num=c.replica_num or 1,
        policy=c.policy or "free_ratio_first",
        preferred_segment=c.preferred_segment,
        tier=int(c.tier),
        soft_pin=c.soft_pin,
        hard_pin=c.hard_pin,
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _MatchEncoder:
    """Builds ``MatchPrefixResponse`` messages from wire-encoded ``InstanceMatch`` entries
    cached by (instance, matched blocks, tiers): one parse in C instead of a message
    object per instance and tier. Bounded: the cache is cleared when it fills."""

    def __init__(self, max_size: int = 65_536) -> None:
        self.max_size = max_size
        self._entries: dict[tuple[object, ...], bytes] = {}
        self._tails: dict[int, bytes] = {}

    def response(self, matches: Sequence[InstanceMatch], block_size: int) -> MatchResponse:
        entries = self._entries
        parts: list[bytes] = []
        for m in matches:
            tiers = m.tiers
            items = tuple(tiers.items()) if len(tiers) < 2 else tuple(sorted(tiers.items()))
            key = (m.instance_id, m.matched_blocks, items)
            enc = entries.get(key)
            if enc is None:
                body = kvmeta_pb2.InstanceMatch(
                    instance_id=m.instance_id,
                    matched_blocks=m.matched_blocks,
                    tiers=[kvmeta_pb2.TierMatch(tier=t, blocks=b) for t, b in items],  # type: ignore[arg-type]
                ).SerializeToString()
                if len(entries) >= self.max_size:
                    entries.clear()
                enc = entries[key] = b"\x0a" + _varint(len(body)) + body  # field 1, LEN
            parts.append(enc)
        tail = self._tails.get(block_size)
        if tail is None:
            tail = self._tails.setdefault(
                block_size,
                kvmeta_pb2.MatchPrefixResponse(block_size=block_size).SerializeToString(),
            )
        parts.append(tail)
        return kvmeta_pb2.MatchPrefixResponse.FromString(b"".join(parts))


class KVMetaServicer(SessionRpcs, _Base):
    """``KVMetaService``: the KV-block index, object master, segment registry and agent
    sessions (in memory only when no ``sessions`` shell is given)."""

    def __init__(
        self,
        feeder: IndexFeeder,
        objects: ObjectShell,
        *,
        max_match_blocks: int = 16384,
        sessions: SessionShell | None = None,
        migrator: SessionMigrator | None = None,
    ):
        self.feeder = feeder
        self.objects = objects
        self.sessions = sessions or SessionShell(SessionTable(), None, objects.now)
        self.migrator = migrator or SessionMigrator(self.sessions)
        self.max_match_blocks = max_match_blocks
        self._encoder = _MatchEncoder()

    # ----------------------------------------------------------- prefix index

    async def MatchPrefix(
        self, request: kvmeta_pb2.MatchPrefixRequest, context: Ctx
    ) -> kvmeta_pb2.MatchPrefixResponse:
        if not request.deployment:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "deployment is required")
        n = len(request.block_hashes)
        if n == 0 or n > self.max_match_blocks:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"block_hashes must hold 1..{self.max_match_blocks} hashes, got {n}",
            )
        try:
            matches = self.feeder.index.match_prefix(
                request.deployment,
                request.tenant,
                request.block_hashes,
                request.candidate_instances or None,
                request.lora,
            )
        except UnknownDeploymentError:
            await _abort(
                context, grpc.StatusCode.NOT_FOUND, f"unknown deployment {request.deployment!r}"
            )
        master = self.objects.master
        if request.candidate_instances and master.segments(request.deployment):
            # The KV-cache tier's leading run of the prompt (objects under the engines'
            # tenant "", as KVTier stores them): fetchable by every candidate.
            keys = [block_key(h) for h in request.block_hashes]
            run = leading_run(master.exist(request.deployment, "", keys))
            matches = with_fetchable(matches, request.candidate_instances, run)
        return self._encoder.response(matches, self.feeder.block_sizes.get(request.deployment, 0))

    async def IngestEvents(
        self, request_iterator: AsyncIterator[events_pb2.KVEventBatch], context: Ctx
    ) -> kvmeta_pb2.IngestEventsResponse:
        applied = skipped = 0
        resync: list[str] = []
        async for batch in request_iterator:
            if not batch.deployment or not batch.instance_id or batch.seq <= 0:
                await _abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"batch {applied + skipped + 1}: deployment, instance_id and seq >= 1 "
                    "are required (earlier batches were applied)",
                )
            try:
                outcome = await self.feeder.ingest(batch)
            except RedisError as exc:
                await _abort(
                    context,
                    grpc.StatusCode.UNAVAILABLE,
                    f"batch {applied + skipped + 1} applied but not logged to the stream "
                    f"({exc}); retry it",
                )
            if outcome is Verdict.DUPLICATE:
                skipped += 1
            else:
                applied += 1
                if outcome is Verdict.GAP and batch.instance_id not in resync:
                    resync.append(batch.instance_id)
        return kvmeta_pb2.IngestEventsResponse(
            batches_applied=applied, batches_skipped=skipped, resync_requested=resync
        )

    async def ListIndexedInstances(
        self, request: kvmeta_pb2.ListIndexedInstancesRequest, context: Ctx
    ) -> kvmeta_pb2.ListIndexedInstancesResponse:
        if not request.deployment:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "deployment is required")
        try:
            infos = self.feeder.index.instances(request.deployment)
        except UnknownDeploymentError:
            await _abort(
                context, grpc.StatusCode.NOT_FOUND, f"unknown deployment {request.deployment!r}"
            )
        return kvmeta_pb2.ListIndexedInstancesResponse(
            instances=[
                kvmeta_pb2.IndexedInstance(
                    instance_id=i.instance_id,
                    epoch=i.epoch,
                    last_seq=i.last_seq,
                    blocks=i.blocks,
                    stale=i.stale,
                    last_seen_ms=int(i.last_seen * 1000),
                )
                for i in infos
            ]
        )

    # ----------------------------------------------------------------- objects

    async def _run(self, context: Ctx, fn: Callable[[], T], *, persist: bool) -> T:
        try:
            out = fn()
        except ObjectError as exc:
            await _abort(context, _code(exc), str(exc))
        if persist:
            await persisted(context, self.objects.persist)
        return out

    async def MountSegment(
        self, request: kvmeta_pb2.MountSegmentRequest, context: Ctx
    ) -> kvmeta_pb2.MountSegmentResponse:
        s = request.segment
        spec = SegmentSpec(
            s.name, s.instance_id, int(s.tier), s.capacity_bytes, s.transfer_address, s.base_address
        )
        om, now = self.objects.master, self.objects.now()
        await self._run(
            context, lambda: om.mount_segment(request.deployment, spec, now), persist=True
        )
        return kvmeta_pb2.MountSegmentResponse()

    async def UnmountSegment(
        self, request: kvmeta_pb2.UnmountSegmentRequest, context: Ctx
    ) -> kvmeta_pb2.UnmountSegmentResponse:
        om, now = self.objects.master, self.objects.now()
        n = await self._run(
            context, lambda: om.unmount_segment(request.deployment, request.name, now), persist=True
        )
        return kvmeta_pb2.UnmountSegmentResponse(replicas_dropped=n)

    async def PutStart(
        self, request: kvmeta_pb2.PutStartRequest, context: Ctx
    ) -> kvmeta_pb2.PutStartResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        reps = await self._run(
            context,
            lambda: om.put_start(r.deployment, r.tenant, r.key, r.size, _config(r.config), now),
            persist=True,
        )
        return kvmeta_pb2.PutStartResponse(replicas=[_replica(x) for x in reps])

    async def PutEnd(
        self, request: kvmeta_pb2.PutEndRequest, context: Ctx
    ) -> kvmeta_pb2.PutEndResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        await self._run(
            context, lambda: om.put_end(r.deployment, r.tenant, r.key, now), persist=True
        )
        return kvmeta_pb2.PutEndResponse()

    async def PutRevoke(
        self, request: kvmeta_pb2.PutRevokeRequest, context: Ctx
    ) -> kvmeta_pb2.PutRevokeResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        await self._run(
            context, lambda: om.put_revoke(r.deployment, r.tenant, r.key, now), persist=True
        )
        return kvmeta_pb2.PutRevokeResponse()

    async def GetReplicaList(
        self, request: kvmeta_pb2.GetReplicaListRequest, context: Ctx
    ) -> kvmeta_pb2.GetReplicaListResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        reps, until = await self._run(
            context, lambda: om.get_replica_list(r.deployment, r.tenant, r.key, now), persist=False
        )
        return kvmeta_pb2.GetReplicaListResponse(
            replicas=[_replica(x) for x in reps], lease_expires_ms=int(until * 1000)
        )

    async def Remove(
        self, request: kvmeta_pb2.RemoveRequest, context: Ctx
    ) -> kvmeta_pb2.RemoveResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        await self._run(
            context, lambda: om.remove(r.deployment, r.tenant, r.key, now), persist=True
        )
        return kvmeta_pb2.RemoveResponse()

    async def Exist(
        self, request: kvmeta_pb2.ExistRequest, context: Ctx
    ) -> kvmeta_pb2.ExistResponse:
        om, r = self.objects.master, request
        return kvmeta_pb2.ExistResponse(exists=om.exist(r.deployment, r.tenant, r.keys))

    async def BatchPutStart(
        self, request: kvmeta_pb2.BatchPutStartRequest, context: Ctx
    ) -> kvmeta_pb2.BatchPutStartResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        res = await self._run(
            context,
            lambda: om.batch_put_start(
                r.deployment, r.tenant, list(r.keys), list(r.sizes), _config(r.config), now
            ),
            persist=True,
        )
        return kvmeta_pb2.BatchPutStartResponse(
            results=[
                kvmeta_pb2.KeyReplicas(key=k, replicas=[_replica(x) for x in reps])
                for k, reps in zip(r.keys, res, strict=True)
            ]
        )

    async def BatchPutEnd(
        self, request: kvmeta_pb2.BatchPutEndRequest, context: Ctx
    ) -> kvmeta_pb2.BatchPutEndResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        await self._run(
            context,
            lambda: om.batch_put_end(r.deployment, r.tenant, list(r.keys), now),
            persist=True,
        )
        return kvmeta_pb2.BatchPutEndResponse(
            results=[kvmeta_pb2.KeyReplicas(key=k) for k in r.keys]
        )

    async def BatchGetReplicaList(
        self, request: kvmeta_pb2.BatchGetReplicaListRequest, context: Ctx
    ) -> kvmeta_pb2.BatchGetReplicaListResponse:
        om, now, r = self.objects.master, self.objects.now(), request
        out = om.batch_get_replica_list(r.deployment, r.tenant, list(r.keys), now)
        results = []
        for key, item in zip(r.keys, out, strict=True):
            if isinstance(item, ObjectError):
                results.append(
                    kvmeta_pb2.KeyReplicas(key=key, error_code=item.code, error=str(item))
                )
            else:
                results.append(
                    kvmeta_pb2.KeyReplicas(key=key, replicas=[_replica(x) for x in item[0]])
                )
        return kvmeta_pb2.BatchGetReplicaListResponse(
            results=results, lease_expires_ms=int((now + om.lease_s) * 1000)
        )


def add_to_server(servicer: KVMetaServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    kvmeta_pb2_grpc.add_KVMetaServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
