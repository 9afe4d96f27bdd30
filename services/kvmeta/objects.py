"""Pure object master (Mooncake-style): segments, objects, replicas, leases, pins, quotas,
eviction. No I/O, no clock: ``now`` (seconds) is a parameter of every call.

Objects are keyed by (deployment, tenant, key); a tenant never sees another's objects.
Lifecycle: ``put_start`` (replicas "processing", invisible) → ``put_end`` ("complete") or
``put_revoke`` / reclamation by ``tick`` after ``put_timeout_s``. ``get_replica_list`` grants
a read lease until ``now + lease_s``; ``remove`` refuses while leased. Eviction (at
``high_watermark`` of a deployment's capacity down to ``low_watermark``, or on demand when a
put does not fit) takes least recently used complete objects, never leased or hard-pinned
ones, and soft-pinned ones only when nothing else is left.

Errors are ``ObjectError`` subclasses whose ``code`` is a gRPC status name. Every mutating
call validates everything before changing anything: a failed call (batch included) leaves
the state unchanged, except for objects it evicted while looking for space (a cache may
always drop unpinned, unleased objects). "Approximate LRU" is exact LRU here (an ordered
dict touched on commit and read), which is cheap in Python. Changed rows are recorded for
the shell (``drain_changes``).

Value types and errors live in :mod:`services.kvmeta.objects_model`, placement and eviction in
:mod:`services.kvmeta.objects_space`; both are re-exported here where callers need them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

from services.kvmeta.allocation import POLICIES, FreeList
from services.kvmeta.objects_model import (
    COMPLETE,
    PROCESSING,
    AlreadyExistsError,
    Changes,
    DeploymentState,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ObjectError,
    ObjectState,
    ObjKey,
    ReplicaConfig,
    ReplicaInfo,
    ResourceExhaustedError,
    SegmentInfo,
    SegmentSpec,
    SegmentState,
    capacity,
    replica_infos,
    require,
    used,
)
from services.kvmeta.objects_space import evict, place

__all__ = [
    "COMPLETE",
    "PROCESSING",
    "AlreadyExistsError",
    "Changes",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "ObjKey",
    "ObjectError",
    "ObjectMaster",
    "ObjectState",
    "ReplicaConfig",
    "ReplicaInfo",
    "ResourceExhaustedError",
    "SegmentInfo",
    "SegmentSpec",
]


class ObjectMaster:
    def __init__(
        self,
        *,
        lease_s: float = 5.0,
        put_timeout_s: float = 30.0,
        high_watermark: float = 0.95,
        low_watermark: float = 0.85,
        quotas: Mapping[str, int] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.lease_s = lease_s
        self.put_timeout_s = put_timeout_s
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        self.quotas: dict[str, int] = dict(quotas or {})
        self._rng = rng or random.Random(0)
        self._deps: dict[str, DeploymentState] = {}
        self._objs: dict[ObjKey, ObjectState] = {}
        self._tenant_used: dict[str, int] = {}
        self._changes = Changes()

    # -------------------------------------------------------------- segments

    def mount_segment(self, deployment: str, spec: SegmentSpec, now: float) -> None:
        """Idempotent for an identical spec; ALREADY_EXISTS if the name is taken differently."""
        require(deployment, "deployment")
        require(spec.name, "segment name")
        if spec.capacity_bytes <= 0:
            raise InvalidArgumentError(
                f"capacity_bytes must be positive, got {spec.capacity_bytes}"
            )
        if spec.tier not in (1, 2, 3, 4):
            raise InvalidArgumentError(f"segment tier must be GPU/CPU/SSD/REMOTE, got {spec.tier}")
        dep = self._deps.setdefault(deployment, DeploymentState())
        old = dep.segments.get(spec.name)
        if old is not None:
            if old.spec == spec:
                return
            raise AlreadyExistsError(f"segment {spec.name!r} is mounted with a different spec")
        dep.segments[spec.name] = SegmentState(spec, FreeList(spec.capacity_bytes))
        self._changes.segments[(deployment, spec.name)] = spec

    def unmount_segment(self, deployment: str, name: str, now: float) -> int:
        """Unmount; drops replicas on it (objects left without replicas vanish). NOT_FOUND."""
        dep = self._deps.get(deployment)
        if dep is None or name not in dep.segments:
            raise NotFoundError(f"segment {name!r} is not mounted in deployment {deployment!r}")
        dropped = 0
        for ok, obj in list(self._objs.items()):
            if ok[0] != deployment:
                continue
            keep = [r for r in obj.replicas if r[0] != name]
            if len(keep) == len(obj.replicas):
                continue
            dropped += len(obj.replicas) - len(keep)
            self._charge(obj.tenant, -obj.size * (len(obj.replicas) - len(keep)))
            if keep:
                obj.replicas = keep
                self._changes.objects[ok] = obj
            else:
                obj.replicas = []
                self._forget(ok)
        del dep.segments[name]
        self._changes.segments[(deployment, name)] = None
        return dropped

    def segments(self, deployment: str) -> list[SegmentInfo]:
        dep = self._deps.get(deployment)
        if dep is None:
            return []
        return [SegmentInfo(s.spec, s.space.used) for _, s in sorted(dep.segments.items())]

    # --------------------------------------------------------------- objects

    def put_start(
        self, deployment: str, tenant: str, key: str, size: int, cfg: ReplicaConfig, now: float
    ) -> list[ReplicaInfo]:
        """Allocate replicas; the object stays invisible until ``put_end``."""
        return self.batch_put_start(deployment, tenant, [key], [size], cfg, now)[0]

    def batch_put_start(
        self,
        deployment: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        cfg: ReplicaConfig,
        now: float,
    ) -> list[list[ReplicaInfo]]:
        """All-or-nothing: either every key is allocated or the state is unchanged."""
        dep = self._dep(deployment)
        if len(keys) != len(sizes):
            raise InvalidArgumentError(f"{len(keys)} keys but {len(sizes)} sizes")
        if not keys:
            raise InvalidArgumentError("no keys")
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError("duplicate keys in batch")
        n = cfg.replica_num or 1
        if n < 0:
            raise InvalidArgumentError(f"replica_num must be positive, got {cfg.replica_num}")
        if (cfg.policy or "free_ratio_first") not in POLICIES:
            raise InvalidArgumentError(
                f"unknown policy {cfg.policy!r}; known: {', '.join(POLICIES)}"
            )
        for key, size in zip(keys, sizes, strict=True):
            require(key, "key")
            if size <= 0:
                raise InvalidArgumentError(f"size of {key!r} must be positive, got {size}")
            old = self._objs.get((deployment, tenant, key))
            if old is not None:
                what = "committed" if old.status == COMPLETE else "being written"
                raise AlreadyExistsError(f"object {key!r} is already {what}")
        need = n * sum(sizes)
        quota = self.quotas.get(tenant)
        if quota is not None and self._tenant_used.get(tenant, 0) + need > quota:
            raise ResourceExhaustedError(
                f"tenant {tenant!r} quota of {quota} bytes exceeded "
                f"(used {self._tenant_used.get(tenant, 0)}, asked {need})"
            )
        placed: list[tuple[ObjKey, list[tuple[str, int]]]] = []
        for key, size in zip(keys, sizes, strict=True):
            reps = place(dep, self._objs, size, n, cfg, now, self._rng, self._drop)
            if reps is None:
                for (_, _, k), done in placed:  # roll back: nothing of this batch survives
                    for seg, off in done:
                        dep.segments[seg].space.release(off, sizes[keys.index(k)])
                raise ResourceExhaustedError(
                    f"no space for {n} replica(s) of {size} bytes for {key!r}"
                )
            placed.append(((deployment, tenant, key), reps))
        out: list[list[ReplicaInfo]] = []
        for (ok, reps), size in zip(placed, sizes, strict=True):
            obj = ObjectState(
                deployment, tenant, ok[2], size, PROCESSING, reps, cfg.soft_pin, cfg.hard_pin, now
            )
            self._objs[ok] = obj
            self._charge(tenant, size * len(reps))
            self._changes.objects[ok] = obj
            out.append(replica_infos(dep, obj))
        return out

    def put_end(self, deployment: str, tenant: str, key: str, now: float) -> None:
        self.batch_put_end(deployment, tenant, [key], now)

    def batch_put_end(self, deployment: str, tenant: str, keys: Sequence[str], now: float) -> None:
        """Commit started puts. NOT_FOUND if unknown; FAILED_PRECONDITION if committed."""
        dep = self._dep(deployment)
        objs = []
        for key in keys:
            obj = self._objs.get((deployment, tenant, key))
            if obj is None:
                raise NotFoundError(f"no put in progress for {key!r}")
            if obj.status == COMPLETE:
                raise FailedPreconditionError(f"object {key!r} is already committed")
            objs.append(obj)
        for obj in objs:
            obj.status = COMPLETE
            ok = (deployment, tenant, obj.key)
            dep.lru[ok] = None
            self._changes.objects[ok] = obj

    def put_revoke(self, deployment: str, tenant: str, key: str, now: float) -> None:
        """Abort a started put. NOT_FOUND if unknown; FAILED_PRECONDITION if committed."""
        obj = self._objs.get((deployment, tenant, key))
        if obj is None:
            raise NotFoundError(f"no put in progress for {key!r}")
        if obj.status == COMPLETE:
            raise FailedPreconditionError(f"object {key!r} is committed; use Remove")
        self._drop((deployment, tenant, key))

    def get_replica_list(
        self, deployment: str, tenant: str, key: str, now: float
    ) -> tuple[list[ReplicaInfo], float]:
        """Replicas of a committed object and the lease expiry. NOT_FOUND otherwise."""
        dep = self._deps.get(deployment)
        obj = self._objs.get((deployment, tenant, key))
        if dep is None or obj is None or obj.status != COMPLETE:
            raise NotFoundError(f"object {key!r} not found")
        obj.lease_until = max(obj.lease_until, now + self.lease_s)
        dep.lru.move_to_end((deployment, tenant, key))
        return replica_infos(dep, obj), obj.lease_until

    def batch_get_replica_list(
        self, deployment: str, tenant: str, keys: Sequence[str], now: float
    ) -> list[tuple[list[ReplicaInfo], float] | ObjectError]:
        """Per-key result or error (read-only apart from leases)."""
        out: list[tuple[list[ReplicaInfo], float] | ObjectError] = []
        for key in keys:
            try:
                out.append(self.get_replica_list(deployment, tenant, key, now))
            except ObjectError as exc:
                out.append(exc)
        return out

    def remove(self, deployment: str, tenant: str, key: str, now: float) -> None:
        """NOT_FOUND if unknown; FAILED_PRECONDITION while leased or being written."""
        obj = self._objs.get((deployment, tenant, key))
        if obj is None:
            raise NotFoundError(f"object {key!r} not found")
        if obj.status != COMPLETE:
            raise FailedPreconditionError(f"object {key!r} is being written; use PutRevoke")
        if obj.lease_until > now:
            raise FailedPreconditionError(
                f"object {key!r} is leased for {obj.lease_until - now:.3f}s more"
            )
        self._drop((deployment, tenant, key))

    def exist(self, deployment: str, tenant: str, keys: Iterable[str]) -> list[bool]:
        objs = self._objs
        return [
            (o := objs.get((deployment, tenant, k))) is not None and o.status == COMPLETE
            for k in keys
        ]

    def deployments(self) -> list[str]:
        return sorted(self._deps)

    def object_counts(self) -> tuple[int, int]:
        """(committed, being written) objects."""
        complete = sum(1 for o in self._objs.values() if o.status == COMPLETE)
        return complete, len(self._objs) - complete

    def usage(self, tenant: str) -> int:
        """Bytes (size x replicas) held by a tenant, processing puts included."""
        return self._tenant_used.get(tenant, 0)

    # ------------------------------------------------------------ background

    def tick(self, now: float) -> tuple[list[ObjKey], list[ObjKey]]:
        """Reclaim stuck puts and evict above the high watermark. Returns (reclaimed, evicted)."""
        stuck = [
            ok
            for ok, o in self._objs.items()
            if o.status == PROCESSING and now - o.started_at > self.put_timeout_s
        ]
        for ok in stuck:
            self._drop(ok)
        evicted: list[ObjKey] = []
        for dep in self._deps.values():
            cap = capacity(dep)
            if cap and used(dep) > self.high_watermark * cap:
                evicted += evict(dep, self._objs, now, self._drop, until=self._below_low)
        return stuck, evicted

    def drain_changes(self) -> Changes:
        out, self._changes = self._changes, Changes()
        return out

    def requeue_changes(self, changes: Changes) -> None:
        """Give back drained changes that could not be persisted (newer ones win)."""
        for sk, spec in changes.segments.items():
            self._changes.segments.setdefault(sk, spec)
        for ok, obj in changes.objects.items():
            self._changes.objects.setdefault(ok, obj)

    def load(
        self, segments: Iterable[tuple[str, SegmentSpec]], objects: Iterable[ObjectState]
    ) -> None:
        """Restore persisted state into an empty master (leases are not persisted)."""
        for deployment, spec in segments:
            mounted = self._deps.setdefault(deployment, DeploymentState()).segments
            mounted[spec.name] = SegmentState(spec, FreeList(spec.capacity_bytes))
        for obj in objects:
            dep = self._deps.get(obj.deployment)
            if dep is None:
                continue
            obj.replicas = [
                (s, off)
                for s, off in obj.replicas
                if s in dep.segments and dep.segments[s].space.reserve(off, obj.size)
            ]
            if not obj.replicas:
                continue
            ok = (obj.deployment, obj.tenant, obj.key)
            obj.lease_until = 0.0
            self._objs[ok] = obj
            self._charge(obj.tenant, obj.size * len(obj.replicas))
            if obj.status == COMPLETE:
                dep.lru[ok] = None
        self._changes = Changes()

    # -------------------------------------------------------------- internal

    def _dep(self, deployment: str) -> DeploymentState:
        require(deployment, "deployment")
        dep = self._deps.get(deployment)
        if dep is None or not dep.segments:
            raise NotFoundError(f"deployment {deployment!r} has no mounted segments")
        return dep

    def _below_low(self, dep: DeploymentState) -> bool:
        return used(dep) <= self.low_watermark * capacity(dep)

    def _drop(self, ok: ObjKey) -> None:
        obj = self._objs[ok]
        dep = self._deps[ok[0]]
        for seg, off in obj.replicas:
            s = dep.segments.get(seg)
            if s is not None:
                s.space.release(off, obj.size)
        self._charge(obj.tenant, -obj.size * len(obj.replicas))
        self._forget(ok)

    def _forget(self, ok: ObjKey) -> None:
        self._objs.pop(ok, None)
        dep = self._deps.get(ok[0])
        if dep is not None:
            dep.lru.pop(ok, None)
        self._changes.objects[ok] = None

    def _charge(self, tenant: str, delta: int) -> None:
        self._tenant_used[tenant] = self._tenant_used.get(tenant, 0) + delta
