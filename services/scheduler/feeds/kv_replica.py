"""Shell of the scheduler-local KV index replica (:mod:`kv_replica_core`): stream in,
lookups out.

:class:`KVReplicaFeed` follows the deployment's KV-event stream ``{prefix}:kv:{deployment}``
with a :class:`~services.common.streams.StreamFollower` (plain ``XREAD``, its own cursor) —
not a consumer group: every scheduler replica needs every event, and a group would take
entries from kvmeta's consumers. On start it replays the stream from its first retained
entry (pages of ``count``, bounded by the producers' MAXLEN), then follows new entries. Consistency contract (a routing hint, never a source of
truth; kvmeta is that):

- an instance whose retained batches start at seq 1 of its epoch, or with a full state, is
  exact as of the last entry read (lag: the stream delay plus at most one ``block_ms``);
- an instance whose earlier batches were trimmed (its first retained batch leaves a gap), or
  which shows a gap later, is *stale*: left out of matches (scores 0, as with kvmeta, which
  does the same) and asked for its full state with a ``tideserve.v1.ResyncRequest`` on
  ``{prefix}:resync:{deployment}`` (the engines' answer is an ordinary full-state batch on the
  KV stream that every consumer applies idempotently; rate-limited per instance with
  backoff by the core). Fleet instances with no retained batch at all are asked once after
  the replay;
- until the replay ends, answers come from what was replayed so far;
- an instance missing from the fleet (``candidates``) for ``forget_after_s`` is dropped
  from the replica (it left; kvmeta drops it on membership).

A stale or missing entry costs cache hits, never correctness. Redis failures are logged,
counted in ``stats`` and retried; lookups never raise.

:class:`LocalLookup` is the gateway's and the servicer's ``prefix_lookup`` hook over the
replica (same signature as :class:`~services.scheduler.feeds.kvmeta_client.KVMetaLookup`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.routing.types import PrefixMatch, RequestView
from services.common.streams import Start, StreamFollower, StreamProducer, stream_name
from services.common.streams.ids import ZERO
from services.scheduler.feeds.kv_replica_core import KVReplica, Verdict

__all__ = ["KVReplicaFeed", "LocalLookup"]

log = logging.getLogger(__name__)


class KVReplicaFeed:
    """Feeds ``replica`` from one deployment's KV stream. :meth:`start` / :meth:`stop`
    (idempotent) run the reader task; :meth:`catch_up`, :meth:`poll_once` and
    :meth:`request_resyncs` are its steps (tests call them directly). The Redis client must
    use ``decode_responses=False``; ``block_ms`` bounds how long a stop waits for a read.

    ``stats``: ``batches`` read, ``applied``, ``duplicate``, ``gap``, ``other_deployment``,
    ``undecodable``, ``errors`` (Redis failures), ``resync_requests`` published,
    ``compactions``, ``dropped`` (instances gone from the fleet). ``candidates``: the fleet's
    instance ids (None: no fleet to follow, nothing is dropped or asked for unprompted).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        replica: KVReplica,
        *,
        deployment: str,
        prefix: str = "ts",
        clock: Callable[[], float] = time.monotonic,
        candidates: Callable[[], Sequence[str]] | None = None,
        block_ms: int = 250,
        count: int = 1000,
        resync: bool = True,
        resync_check_s: float = 1.0,
        compact_at: int = 16,
        forget_after_s: float = 60.0,
    ) -> None:
        self.replica = replica
        self.deployment = deployment
        self.stream = stream_name(prefix, "kv", deployment)
        self.resync_stream = stream_name(prefix, "resync", deployment)
        self.clock = clock
        self.candidates = candidates
        self.block_ms = block_ms
        self.resync = resync
        self.resync_check_s = resync_check_s
        self.compact_at = compact_at
        self.forget_after_s = forget_after_s
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "batches",
                "applied",
                "duplicate",
                "gap",
                "other_deployment",
                "undecodable",
                "errors",
                "resync_requests",
                "compactions",
                "dropped",
            ),
            0,
        )
        self._producer = StreamProducer(redis)
        self._follower = StreamFollower(
            redis,
            self.stream,
            events_pb2.KVEventBatch,
            self._apply,
            start=Start.beginning(),
            count=count,
            block_ms=block_ms,
            after_poll=self._after_poll,
            stats=self.stats,
            stat_names={"read": "batches", "undecodable": "undecodable", "errors": "errors"},
            name="kv replica",
        )
        self._asked_unknown = False
        self._next_check = 0.0

    @property
    def last_id(self) -> str:
        """The last entry read (``"0-0"``: none yet)."""
        return self._follower.position or ZERO

    @property
    def caught_up(self) -> bool:
        """Whether the replay of the retained entries has reached the end of the stream."""
        return self._follower.caught_up

    # ------------------------------------------------------------------ steps
    def _apply(self, b: events_pb2.KVEventBatch, _entry_id: str) -> None:
        if b.deployment and b.deployment != self.deployment:
            self.stats["other_deployment"] += 1
            return
        res = self.replica.apply(b.instance_id, b.epoch, b.seq, b.events, b.full_state_continues)
        self.stats[res.value] += 1
        if res is Verdict.GAP:
            log.info(
                "kv replica: gap for %s at epoch %d seq %d; stale until its full state",
                b.instance_id,
                b.epoch,
                b.seq,
            )

    async def catch_up(self) -> int:
        """Apply every retained entry after the cursor (pages of ``count``, no waiting);
        returns how many. Raises RedisError/OSError (the cursor keeps what was applied)."""
        n = 0
        while True:
            read = await self._follower.poll_once(block_ms=0)
            n += read
            if read < self._follower.count:
                return n

    async def poll_once(self, block_ms: int | None = None) -> int:
        """Read and apply one batch of new entries, waiting up to ``block_ms`` (0 = answer
        at once). Returns the entries read. Raises RedisError/OSError."""
        return await self._follower.poll_once(block_ms)

    async def request_resyncs(self, extra: Sequence[str] = ()) -> list[str]:
        """Publish a ResyncRequest for each stale instance due one (and for ``extra``
        instance ids); returns the ids asked. On a failed publish nothing counts as asked
        (the next call asks again) and the RedisError/OSError propagates."""
        due = self.replica.due_resyncs(self.clock())
        asks = [*due, *((iid, 0) for iid in extra)]
        if not asks:
            return []
        now_ms = int(time.time() * 1000)
        reqs = [
            events_pb2.ResyncRequest(
                deployment=self.deployment,
                instance_id=iid,
                epoch=epoch,
                reason="scheduler kv replica: " + ("gap in KV events" if epoch else "no state"),
                requested_ms=now_ms,
            )
            for iid, epoch in asks
        ]
        try:
            await self._producer.publish_many(self.resync_stream, reqs)
        except BaseException:
            self.replica.forget_asked(iid for iid, _ in due)
            raise
        self.stats["resync_requests"] += len(reqs)
        return [iid for iid, _ in asks]

    def housekeeping(self) -> None:
        """Forget instances gone from the fleet (with ``candidates``), compact when enough
        slots are retired."""
        if self.candidates is not None:
            gone = self.replica.retain(self.candidates(), self.clock(), self.forget_after_s)
            self.stats["dropped"] += len(gone)
        if self.replica.retired_slots >= self.compact_at:
            self.replica.compact()
            self.stats["compactions"] += 1

    # -------------------------------------------------------------- lifecycle
    async def _after_poll(self, _n: int) -> None:
        """After each read of the running feed: once the replay is done, ask the fleet's
        instances with no retained batch for their state, then every ``resync_check_s``
        forget departed instances and ask stale ones again."""
        if not self.caught_up:
            return
        now = self.clock()
        if not self._asked_unknown:
            if self.resync and self.candidates is not None:
                known = {i.instance_id for i in self.replica.instances()}
                await self.request_resyncs([c for c in self.candidates() if c not in known])
            self._asked_unknown = True
            self._next_check = now + self.resync_check_s
        elif now >= self._next_check:
            self._next_check = now + self.resync_check_s
            self.housekeeping()
            if self.resync:
                await self.request_resyncs()

    def start(self) -> None:
        self._follower.start()

    async def stop(self) -> None:
        """Let the current read return (within ``block_ms``), then end the task; bounded."""
        await self._follower.stop()

    @property
    def _task(self) -> asyncio.Task[None] | None:  # tests check that stop() ended it
        return self._follower.task


class LocalLookup:
    """``await lookup(view, deployment, tenant, profile)`` → matches from the replica.

    ``profiles`` limits lookups to profiles that use precise data (None = always); the
    namespace is (``tenant``, ``view.lora``): the index tenant (see ``Intake``) and LoRA the
    engines' events are stamped with. Returns None for
    another deployment or a request without hashes; never raises. ``stats``: ``calls``,
    ``matched`` (answers naming at least one instance), ``skipped``.
    """

    def __init__(
        self,
        replica: KVReplica,
        *,
        deployment: str,
        profiles: frozenset[str] | None = None,
    ) -> None:
        self.replica = replica
        self.deployment = deployment
        self.profiles = profiles
        self.stats: dict[str, int] = {"calls": 0, "matched": 0, "skipped": 0}

    async def __call__(
        self, view: RequestView, deployment: str, tenant: str = "", profile: str = ""
    ) -> Mapping[str, PrefixMatch] | None:
        return self.lookup(view, deployment, tenant, profile)

    def lookup(
        self, view: RequestView, deployment: str, tenant: str = "", profile: str = ""
    ) -> Mapping[str, PrefixMatch] | None:
        """The synchronous form of the call."""
        if (
            not view.block_hashes
            or deployment != self.deployment
            or (self.profiles is not None and profile not in self.profiles)
        ):
            self.stats["skipped"] += 1
            return None
        self.stats["calls"] += 1
        out = self.replica.match(view.block_hashes, tenant, view.lora)
        if out:
            self.stats["matched"] += 1
        return out
