"""Shell around the prefix index: feeds it from Redis streams and gRPC, checkpoints it.

Durability contract: the KV-event stream ``{prefix}:kv:{deployment}`` is the write-ahead
log. An entry is acknowledged (consumer group ``group``) only after it was applied to the
in-memory index. Every ``checkpoint_interval_s`` the index of each changed deployment is
snapshotted to Postgres with the id of the newest entry applied. On start, the newest
checkpoint is loaded and the stream is replayed with XRANGE after that id (acknowledged
entries included), then the group consumer resumes; pending entries are reclaimed by the
group. Apply is idempotent per (instance, epoch, seq), so overlap is harmless: nothing
acknowledged is lost by a kill -9. If the stream was trimmed past the checkpoint, the
deployment's instances are marked stale (they need a resync).

Batches received over gRPC are published to the same stream first (when Redis is
configured), so they are as durable as engine-published ones.

Resync: a stale instance (a gap in its seqs, or a trimmed stream) is asked for its full
state with a ``tideserve.v1.ResyncRequest`` on ``{prefix}:resync:{deployment}``; which
instances to ask and when is decided by the pure :func:`services.common.kvindex.plan_resyncs`
(one outstanding request per instance, retried with backoff while still stale), checked at
once after a gap and every ``resync_check_s``. The engine's answer is an ordinary full-state
batch on the KV stream, which clears the stale flag when applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from tideserve.v1 import events_pb2

from services.common.kvindex import (
    Outstanding,
    ResyncPolicy,
    StaleInstance,
    Verdict,
    plan_resyncs,
)
from services.common.streams import StreamConsumer, StreamProducer, decode_entry, stream_name
from services.common.streams.ids import NEWEST, ZERO, as_id, compare_ids, exclusive
from services.common.streams.poison import DEFAULT_MAX_ATTEMPTS
from services.common.tasks import pause, stop_tasks
from services.kvmeta.checkpoint import KVMetaStore
from services.kvmeta.engine_urls import GONE_STATES, EngineUrls, replay_membership
from services.kvmeta.index import PrefixIndex
from services.kvmeta.index_codec import compress_snapshot

__all__ = ["IndexFeeder"]

log = logging.getLogger(__name__)

_CHECKPOINT_DUTY = 20.0  # periodic checkpoints block the loop at most ~1/20 of the time
# label of each verdict in ``outcomes`` (and the ingest metric): kvmeta's names since v1
OUTCOME_LABELS = {
    Verdict.APPLIED: "applied",
    Verdict.DUPLICATE: "skipped",
    Verdict.GAP: "resync_needed",
}


class IndexFeeder:
    """Owns the live ``PrefixIndex`` of the service. All methods run on one event loop."""

    def __init__(
        self,
        index: PrefixIndex,
        wall: Callable[[], float],
        *,
        redis: aioredis.Redis | None = None,
        store: KVMetaStore | None = None,
        prefix: str = "ts",
        group: str = "kvmeta",
        consumer: str = "kvmeta-1",
        checkpoint_interval_s: float = 10.0,
        expire_after_s: float = 0.0,
        discover_interval_s: float = 2.0,
        block_ms: int = 500,
        claim_idle_ms: int = 30_000,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        resync_policy: ResyncPolicy | None = None,
        resync_check_s: float = 1.0,
        engine_urls: EngineUrls | None = None,
    ) -> None:
        """``engine_urls``: learns the engines' URLs from the membership events it reads
        (:mod:`services.kvmeta.engine_urls`)."""
        self.index = index
        self.engine_urls = engine_urls
        self._wall = wall
        self._redis = redis
        self._producer = StreamProducer(redis) if redis is not None else None
        self._store = store
        self.prefix = prefix
        self.group = group
        self.consumer = consumer
        self.checkpoint_interval_s = checkpoint_interval_s
        self.expire_after_s = expire_after_s
        self.discover_interval_s = discover_interval_s
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.max_attempts = max_attempts
        self.replay_failed = 0  # replayed entries whose apply raised (skipped)
        self.positions: dict[str, str] = {}  # deployment -> newest applied kv entry id
        self.block_sizes: dict[str, int] = {}
        self._dirty: set[str] = set()
        self.outcomes: dict[str, int] = dict.fromkeys(
            OUTCOME_LABELS.values(), 0
        )  # batches by outcome
        self._next_checkpoint: dict[str, float] = {}  # deployment -> monotonic time
        self._consumers: dict[str, StreamConsumer[events_pb2.KVEventBatch]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self.resync_policy = resync_policy or ResyncPolicy()
        self.resync_check_s = resync_check_s
        self.resync_outstanding: dict[tuple[str, str], Outstanding] = {}
        self.resync_requests_sent = 0
        self._resync_reasons: dict[tuple[str, str], str] = {}
        self._resync_due = asyncio.Event()

    # ------------------------------------------------------------------ apply

    def apply(self, batch: events_pb2.KVEventBatch, deployment: str = "") -> Verdict:
        """Apply one batch (protobuf events are passed through, no copy)."""
        dep = batch.deployment or deployment
        if batch.block_size > 0:
            self.block_sizes[dep] = batch.block_size
        self._dirty.add(dep)
        outcome = self.index.apply_batch(
            dep,
            batch.instance_id,
            batch.epoch,
            batch.seq,
            batch.events,
            self._wall(),
            batch.full_state_continues,
        )
        self.outcomes[OUTCOME_LABELS[outcome]] += 1
        if outcome is Verdict.GAP:
            self._resync_reasons[(dep, batch.instance_id)] = (
                f"seq gap: batches before epoch {batch.epoch} seq {batch.seq} are missing"
            )
            self._resync_due.set()
        return outcome

    async def ingest(self, batch: events_pb2.KVEventBatch) -> Verdict:
        """A batch from gRPC: applied, then appended to the deployment's stream (the WAL).

        Appended even when skipped as a duplicate, so a client retrying after a failed append
        still gets its batch logged; consumers skip the copies. Raises RedisError if the
        append fails (the caller reports UNAVAILABLE; the batch is then not durable).
        """
        outcome = self.apply(batch)
        if self._producer is not None:
            await self._producer.publish(stream_name(self.prefix, "kv", batch.deployment), batch)
        return outcome

    async def _on_kv(self, deployment: str, msg: events_pb2.KVEventBatch, entry_id: str) -> None:
        outcome = self.apply(msg, deployment)
        pos = self.positions.get(deployment)
        if pos is None or compare_ids(entry_id, pos) > 0:
            self.positions[deployment] = entry_id
        if outcome is Verdict.GAP:
            log.warning(
                "kv events: gap for %s/%s at epoch %d seq %d; instance stale until resync",
                deployment,
                msg.instance_id,
                msg.epoch,
                msg.seq,
            )

    async def _on_load(self, msg: events_pb2.LoadSnapshot, entry_id: str) -> None:
        self.index.touch(msg.deployment, msg.instance_id, self._wall())

    async def _on_membership(self, msg: events_pb2.MembershipEvent, entry_id: str) -> None:
        inst = msg.instance
        if self.engine_urls is not None:
            self.engine_urls.apply(msg)
        if msg.kind == events_pb2.MembershipEvent.KIND_REMOVED or inst.state in GONE_STATES:
            if self.index.drop_instance(inst.deployment, inst.instance_id):
                self._dirty.add(inst.deployment)
                log.info(
                    "dropped %s/%s from the index (%s)",
                    inst.deployment,
                    inst.instance_id,
                    msg.reason or "membership",
                )
                # membership is not replayed after a crash: make the drop durable before ack
                if self._store is not None:
                    await self.checkpoint()

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load checkpoints, replay streams, start consumers and periodic work."""
        t0 = time.perf_counter()
        if self._store is not None:
            for dep, (pos, blob) in (await self._store.latest_checkpoints()).items():
                try:
                    self.index.load_snapshot(blob)
                except ValueError as exc:
                    log.error(
                        "checkpoint of %s unusable (%s); rebuilding from the stream", dep, exc
                    )
                    continue
                self.positions[dep] = pos
                log.info("loaded index checkpoint of %s at %s", dep, pos)
        t1 = time.perf_counter()
        if self._redis is not None:
            await self.discover()
            self._tasks.append(asyncio.create_task(self._discover_loop()))
            self._tasks.append(asyncio.create_task(self._resync_loop()))
            membership = stream_name(self.prefix, "membership")
            if self.engine_urls is not None:
                await replay_membership(self._redis, membership, self.engine_urls)
            self._start_consumer(
                membership,
                self._on_membership,
                events_pb2.MembershipEvent,
                NEWEST,
            )
        log.info(
            "index ready: %d entries in %.3fs (checkpoints %.3fs, stream replay %.3fs)",
            self.index.entry_count(),
            time.perf_counter() - t0,
            t1 - t0,
            time.perf_counter() - t1,
        )
        if self._store is not None and self.checkpoint_interval_s > 0:
            self._tasks.append(
                asyncio.create_task(
                    self._every(self.checkpoint_interval_s, self._periodic_checkpoint)
                )
            )
        if self.expire_after_s > 0:
            self._tasks.append(
                asyncio.create_task(self._every(max(0.1, self.expire_after_s / 4), self._expire))
            )

    async def stop(self, *, checkpoint: bool = True) -> None:
        """Stop consumers and loops, then write a final checkpoint (unless told not to)."""
        self._stop.set()
        self._resync_due.set()
        await stop_tasks(self._tasks)
        self._tasks.clear()
        self._consumers.clear()
        if self._store is not None and checkpoint:
            with contextlib.suppress(SQLAlchemyError, OSError):
                await self.checkpoint()

    async def discover(self) -> list[str]:
        """Find new ``{prefix}:kv:*`` / ``{prefix}:load:*`` streams; replay and consume them."""
        assert self._redis is not None
        found: list[str] = []
        for kind in ("kv", "load"):
            pattern = f"{self.prefix}:{kind}:*"
            async for raw in self._redis.scan_iter(match=pattern, _type="stream"):
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
                if name.endswith(":dead") or name in self._consumers:
                    continue
                dep = name[len(self.prefix) + len(kind) + 2 :]
                if kind == "kv":
                    await self._replay(name, dep)
                    self._start_consumer(name, self._kv_handler(dep), events_pb2.KVEventBatch, "0")
                else:
                    self._start_consumer(name, self._on_load, events_pb2.LoadSnapshot, NEWEST)
                    # An engine's load snapshots come before its first KV event: watch its
                    # KV stream now rather than one discovery period after that event.
                    await self.watch(dep)
                found.append(name)
        return found

    async def watch(self, deployment: str) -> None:
        """Start consuming a deployment's KV stream now (creating it if missing)."""
        name = stream_name(self.prefix, "kv", deployment)
        if name not in self._consumers:
            await self._replay(name, deployment)
            self._start_consumer(name, self._kv_handler(deployment), events_pb2.KVEventBatch, "0")

    def _kv_handler(
        self, dep: str
    ) -> Callable[[events_pb2.KVEventBatch, str], asyncio.Future[None]]:
        async def handle(msg: events_pb2.KVEventBatch, entry_id: str) -> None:
            await self._on_kv(dep, msg, entry_id)

        return handle  # type: ignore[return-value]

    def _start_consumer(self, stream: str, handler: object, mtype: type, start_id: str) -> None:
        consumer: StreamConsumer = StreamConsumer(  # type: ignore[type-arg]
            self._redis,  # type: ignore[arg-type]
            stream,
            self.group,
            self.consumer,
            handler,  # type: ignore[arg-type]
            mtype,
            block_ms=self.block_ms,
            claim_idle_ms=self.claim_idle_ms,
            start_id=start_id,
            max_attempts=self.max_attempts,
        )
        self._consumers[stream] = consumer
        self._tasks.append(asyncio.create_task(consumer.run(self._stop)))

    async def _replay(self, stream: str, dep: str) -> int:
        """Apply every entry after the checkpoint position (XRANGE, acknowledged ones too)."""
        assert self._redis is not None
        pos = self.positions.get(dep, ZERO)  # no checkpoint: the whole stream is the state
        if await self._trimmed_past(stream, pos):
            stale = self.index.mark_stale(dep)
            for iid in stale:
                self._resync_reasons[(dep, iid)] = f"stream {stream} trimmed past {pos}"
            self._resync_due.set()
            log.warning(
                "stream %s lost entries after %s (trimmed); %d instances need a resync",
                stream,
                pos,
                len(stale),
            )
        n = 0
        cursor = pos
        while True:
            rows = await self._redis.xrange(stream, min=exclusive(cursor), max="+", count=1000)
            if not rows:
                break
            for raw_id, fields in rows:
                eid = as_id(raw_id)
                try:
                    msg = decode_entry(fields, events_pb2.KVEventBatch)
                except ValueError:
                    continue  # the group consumer dead-letters it
                cursor = eid
                try:
                    await self._on_kv(dep, msg, eid)
                except Exception:
                    # A poison entry must not stop kvmeta from starting (a crash loop): the
                    # group consumer judges it (bounded retries, then dead letters).
                    self.replay_failed += 1
                    log.exception("replaying %s: entry %s not applied; skipped", stream, eid)
                    continue
                n += 1
        if n:
            log.info("replayed %d entries of %s after checkpoint %s", n, stream, pos)
        return n

    async def _trimmed_past(self, stream: str, pos: str) -> bool:
        """Whether entries after ``pos`` were deleted/trimmed before we could replay them."""
        assert self._redis is not None
        try:
            info = await self._redis.xinfo_stream(stream)
        except RedisError:
            return False
        info = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in info.items()}
        deleted = info.get("max-deleted-entry-id")
        if deleted is not None:  # Redis >= 7
            return compare_ids(as_id(deleted), pos) > 0
        first: Any = info.get("first-entry")
        # Redis 6: only a checkpointed position older than the first entry is detectable
        if not first or pos == ZERO:
            return False
        return compare_ids(as_id(first[0]), pos) > 0

    async def checkpoint(self, *, force: bool = True) -> int:
        """Snapshot each deployment changed since its last checkpoint; returns how many.

        The encoding runs on the loop (the index must not change meanwhile), compression in
        a thread. Unless ``force``, a deployment is skipped while its previous encoding
        time x ``_CHECKPOINT_DUTY`` has not elapsed, so huge indexes keep the loop free.
        """
        if self._store is None:
            return 0
        done = 0
        for dep in sorted(self._dirty):
            if not force and time.monotonic() < self._next_checkpoint.get(dep, 0.0):
                continue
            self._dirty.discard(dep)
            t0 = time.monotonic()
            raw = self.index.snapshot_raw([dep])
            pos = self.positions.get(dep, ZERO)
            spent = time.monotonic() - t0
            self._next_checkpoint[dep] = time.monotonic() + spent * _CHECKPOINT_DUTY
            try:
                blob = await asyncio.to_thread(compress_snapshot, raw)
                await self._store.save_checkpoint(dep, pos, blob)
            except BaseException:
                self._dirty.add(dep)
                raise
            done += 1
        return done

    async def _periodic_checkpoint(self) -> None:
        await self.checkpoint(force=False)

    async def _expire(self) -> None:
        for dep, iid in self.index.expire(self._wall(), self.expire_after_s):
            self._dirty.add(dep)
            log.info(
                "dropped %s/%s from the index: no load snapshot for %.1fs",
                dep,
                iid,
                self.expire_after_s,
            )
        for dep in self.index.deployments():
            if self.index.retired_slots(dep) >= 16:
                self.index.compact([dep])

    # ----------------------------------------------------------------- resync

    async def request_resyncs(self) -> list[StaleInstance]:
        """Publish a ``ResyncRequest`` to each stale instance due one now (see
        :func:`plan_resyncs`); returns those asked. No-op without Redis. Raises RedisError /
        OSError, then nothing is recorded as outstanding (the next call asks again)."""
        if self._producer is None:
            return []
        index = self.index
        stale = [
            StaleInstance(dep, i.instance_id, i.epoch)
            for dep in index.deployments()
            if index.stale_instances(dep)
            for i in index.instances(dep)
            if i.stale
        ]
        now = self._wall()
        plan = plan_resyncs(stale, self.resync_outstanding, now, self.resync_policy)
        streams: dict[str, list[events_pb2.ResyncRequest]] = {}
        for inst in plan.send:
            reason = self._resync_reasons.get(inst.key, "stale: KV events may have been lost")
            streams.setdefault(stream_name(self.prefix, "resync", inst.deployment), []).append(
                events_pb2.ResyncRequest(
                    deployment=inst.deployment,
                    instance_id=inst.instance_id,
                    epoch=inst.epoch,
                    reason=reason,
                    requested_ms=int(now * 1000),
                )
            )
        for stream, reqs in streams.items():
            await self._producer.publish_many(stream, reqs)
        for inst in plan.send:
            log.info(
                "asked %s/%s (epoch %d) for a full resync: %s",
                inst.deployment,
                inst.instance_id,
                inst.epoch,
                self._resync_reasons.get(inst.key, "stale"),
            )
        self.resync_outstanding = plan.outstanding
        self.resync_requests_sent += len(plan.send)
        for key in [k for k in self._resync_reasons if k not in plan.outstanding]:
            del self._resync_reasons[key]  # answered (or never stale): forget why
        return plan.send

    async def _resync_loop(self) -> None:
        # Every loop here ends when _stop is set, even if a cancellation was swallowed on the
        # way (3.11's wait_for and redis-py commands can swallow one): stop() never hangs.
        while not self._stop.is_set():
            await pause(self._resync_due, self.resync_check_s)
            if self._stop.is_set():
                return
            self._resync_due.clear()
            try:
                await self.request_resyncs()
            except (RedisError, OSError) as exc:
                log.warning("resync requests not published (retried): %s", exc)

    async def _discover_loop(self) -> None:
        while not self._stop.is_set():
            await pause(self._stop, self.discover_interval_s)
            if self._stop.is_set():
                return
            try:
                await self.discover()
            except RedisError as exc:
                log.warning("stream discovery failed: %s", exc)

    async def _every(self, period: float, fn: Callable[[], object]) -> None:
        while not self._stop.is_set():
            await pause(self._stop, period)
            if self._stop.is_set():
                return
            try:
                res = fn()
                if asyncio.iscoroutine(res):
                    await res
            except (SQLAlchemyError, RedisError, OSError) as exc:
                log.warning("periodic %s failed: %s", getattr(fn, "__name__", fn), exc)

    def stale(self, deployments: Sequence[str]) -> list[str]:
        return [i for d in deployments for i in self.index.stale_instances(d)]
