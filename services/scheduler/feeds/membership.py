"""Dynamic endpoint membership: the autoscaler's ``ListInstances`` and ``{prefix}:membership``.

Endpoints come from the static ``endpoints`` list and, in addition, from:

1. a seed on start: ``AutoscalerService.ListInstances(deployment)`` once, when
   ``autoscaler_address`` is set. Any gRPC error (the autoscaler answers UNIMPLEMENTED
   until it exists, or is unreachable) logs one line and the gateway carries on with the
   static list;
2. ``tideserve.v1.MembershipEvent`` entries on ``{prefix}:membership``, read by every
   replica with plain ``XREAD``. After a successful seed the reader starts at the stream's
   last entry as of just before the seed (no event is lost in between); without one it
   replays the stream from the beginning, which rebuilds the current membership (events
   are idempotent state changes applied in order).

Event semantics (:func:`apply_event`, pure):

- ``ADDED`` / ``STATE_CHANGED`` to READY (or an unspecified state): add the endpoint or
  update its address, role and labels, and undrain it;
- STARTING: add it as not yet healthy (the active health check makes it eligible);
- DRAINING: no new requests (in-flight ones finish); unknown instances are ignored;
- ``REMOVED``, or state STOPPED/FAILED: :meth:`Fleet.retire` — gone at once if this gateway
  has nothing in flight on it, else drained and forgotten when its last request finishes.

Instances are matched to known endpoints by id, else by URL (a static ``URL`` entry and an
autoscaler instance of the same engine are one endpoint). Events of other deployments and
non-routable roles (``ROLE_KVCACHE``) are ignored.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import grpc
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc, common_pb2, events_pb2

from services.common.routing.types import Role
from services.common.scheduling.fleet import EndpointSpec, Fleet
from services.common.streams import Start, StreamFollower, newest_id, stream_name
from services.common.streams.ids import ZERO

__all__ = ["Membership", "apply_event", "apply_instance"]

log = logging.getLogger(__name__)

_ROLES: dict[int, Role] = {
    common_pb2.ROLE_UNSPECIFIED: "worker",
    common_pb2.ROLE_WORKER: "worker",
    common_pb2.ROLE_PREFILL: "prefill",
    common_pb2.ROLE_DECODE: "decode",
}
_GONE = frozenset({common_pb2.INSTANCE_STATE_STOPPED, common_pb2.INSTANCE_STATE_FAILED})


def _spec(inst: common_pb2.Instance, iid: str, role: Role, deployment: str) -> EndpointSpec:
    ep = inst.endpoint
    return EndpointSpec(
        instance_id=iid,
        url=ep.url.rstrip("/"),
        role=role,
        bootstrap_host=ep.bootstrap_host,
        bootstrap_port=ep.bootstrap_port,
        deployment=inst.deployment or deployment,
        labels=dict(inst.labels),
    )


def apply_instance(
    fleet: Fleet,
    inst: common_pb2.Instance,
    *,
    deployment: str,
    removed: bool = False,
) -> str:
    """Apply one instance's current state to ``fleet`` (pure). Returns what happened:
    ``ready``, ``starting``, ``draining``, ``removed``, ``retiring`` or an ignore reason
    (``other_deployment``, ``bad_role``, ``no_url``, ``unknown``)."""
    if inst.deployment and deployment and inst.deployment != deployment:
        return "other_deployment"
    url = inst.endpoint.url.rstrip("/")
    known = fleet.resolve(inst.instance_id, url)
    if removed or inst.state in _GONE:
        if known is None:
            return "unknown"
        return "removed" if fleet.retire(known) else "retiring"
    if inst.state == common_pb2.INSTANCE_STATE_DRAINING:
        if known is None:
            return "unknown"
        fleet.set_draining(known, True)
        return "draining"
    role = _ROLES.get(inst.role)
    if role is None:
        return "bad_role"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "no_url"
    iid = known or inst.instance_id or f"{parts.hostname}:{parts.port or 80}"
    if inst.state == common_pb2.INSTANCE_STATE_STARTING:
        fleet.upsert(_spec(inst, iid, role, deployment), healthy=False)
        return "starting"
    fleet.upsert(_spec(inst, iid, role, deployment))
    fleet.set_draining(iid, False)
    return "ready"


def apply_event(fleet: Fleet, ev: events_pb2.MembershipEvent, *, deployment: str) -> str:
    """Apply one membership event (pure); see :func:`apply_instance` for the results."""
    if ev.kind == events_pb2.MembershipEvent.KIND_UNSPECIFIED:
        return "bad_kind"
    return apply_instance(
        fleet,
        ev.instance,
        deployment=deployment,
        removed=ev.kind == events_pb2.MembershipEvent.KIND_REMOVED,
    )


class Membership:
    """Seeds the fleet from the autoscaler and follows the membership stream.

    ``redis`` None = no stream; ``channel`` None = no seed. :meth:`start` seeds (never
    raises) and starts the reader; :meth:`stop` is idempotent. ``stats`` counts results of
    :func:`apply_event` plus ``undecodable``, ``errors`` (Redis, retried), ``seeded``
    (instances from ListInstances) and ``seed_failed``."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        deployment: str,
        redis: aioredis.Redis | None = None,
        prefix: str = "ts",
        channel: grpc.aio.Channel | None = None,
        autoscaler: str = "",
        deadline_s: float = 3.0,
        block_ms: int = 1000,
    ) -> None:
        self.fleet = fleet
        self.deployment = deployment
        self.redis = redis
        self.stream = stream_name(prefix, "membership")
        self.channel = channel
        self.autoscaler = autoscaler
        self.deadline_s = deadline_s
        self.block_ms = block_ms
        self.stats: dict[str, int] = {"seeded": 0, "seed_failed": 0, "undecodable": 0, "errors": 0}
        self._follower: StreamFollower[events_pb2.MembershipEvent] | None = None
        if redis is not None:
            self._follower = StreamFollower(
                redis,
                self.stream,
                events_pb2.MembershipEvent,
                self._apply,
                start=Start.beginning(),
                count=512,
                block_ms=block_ms,
                stats=self.stats,
                stat_names={"undecodable": "undecodable", "errors": "errors"},
                name="membership",
            )

    @property
    def last_id(self) -> str:
        """The last entry read."""
        pos = self._follower.position if self._follower is not None else None
        return pos or ZERO

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    async def seed(self) -> bool:
        """Call ListInstances once and apply its answer; False (one log line) on any gRPC
        error or when there is no channel."""
        if self.channel is None:
            return False
        stub: Any = autoscaler_pb2_grpc.AutoscalerServiceStub(self.channel)
        try:
            resp = await stub.ListInstances(
                autoscaler_pb2.ListInstancesRequest(deployment=self.deployment),
                timeout=self.deadline_s,
            )
        except grpc.aio.AioRpcError as e:
            self._count("seed_failed")
            log.warning(
                "autoscaler %s: ListInstances failed (%s: %s); using the static endpoint list",
                self.autoscaler or "(channel)",
                e.code().name,
                (e.details() or "").splitlines()[0] if e.details() else "",
            )
            return False
        for inst in resp.instances:
            self._count(apply_instance(self.fleet, inst, deployment=self.deployment))
            self.stats["seeded"] += 1
        log.info("autoscaler: %d instances of %s", len(resp.instances), self.deployment)
        return True

    def _apply(self, ev: events_pb2.MembershipEvent, _entry_id: str) -> None:
        result = apply_event(self.fleet, ev, deployment=self.deployment)
        self._count(result)
        if result in ("ready", "starting", "draining", "removed", "retiring"):
            log.info("membership: %s %s (%s)", ev.instance.instance_id, result, ev.reason)

    async def poll_once(self, block_ms: int | None = None) -> int:
        """Read and apply one batch after :attr:`last_id` (waits up to ``block_ms``; 0 =
        answer at once). Returns entries read. Raises ``RedisError``/``OSError``."""
        assert self._follower is not None
        return await self._follower.poll_once(block_ms)

    async def start(self) -> None:
        """Seed, then follow the stream (from just before the seed, or from the start
        when there was no seed). Never raises for an unreachable Redis or autoscaler."""
        tail = ZERO
        if self.redis is not None:
            try:
                tail = await newest_id(self.redis, self.stream)
            except (RedisError, OSError) as e:
                self._count("errors")
                log.warning("membership: reading %s failed: %s", self.stream, e)
        seeded = await self.seed()
        if self._follower is not None and self._follower.task is None:
            self._follower.seek(tail if seeded else ZERO)
            self._follower.start()

    async def stop(self) -> None:
        if self._follower is not None:
            await self._follower.stop()
