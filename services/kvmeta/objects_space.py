"""Space policy of the object master (:mod:`services.kvmeta.objects`): placing replicas on a
deployment's segments and evicting objects to make room.

Eviction takes least recently used complete objects first; never leased (``lease_until >
now``) or hard-pinned ones, and soft-pinned ones only when nothing else is left. Removing an
evicted object is the caller's ``drop`` callback (it also releases the object's space and
records the change), so these functions never see the master's bookkeeping. Pure: ``now`` is
a parameter.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from services.kvmeta.allocation import Candidate, choose_segments
from services.kvmeta.objects_model import (
    DeploymentState,
    ObjectState,
    ObjKey,
    ReplicaConfig,
)

__all__ = ["evict", "place"]

Drop = Callable[[ObjKey], None]


def place(
    dep: DeploymentState,
    objs: Mapping[ObjKey, ObjectState],
    size: int,
    n: int,
    cfg: ReplicaConfig,
    now: float,
    rng: random.Random,
    drop: Drop,
) -> list[tuple[str, int]] | None:
    """Allocate ``n`` replicas of ``size`` bytes on distinct segments (of ``cfg.tier`` if set)
    and return them as [(segment, offset)]; evicts one object at a time from those segments
    until they fit. None (nothing allocated, possibly some objects evicted) if they cannot."""
    segs = [s for s in dep.segments.values() if not cfg.tier or s.spec.tier == cfg.tier]
    if len([s for s in segs if s.spec.capacity_bytes >= size]) < n:
        return None
    while True:
        cands = [Candidate(s.spec.name, s.space.free, s.spec.capacity_bytes) for s in segs]
        names = choose_segments(
            cfg.policy or "free_ratio_first",
            cands,
            n,
            size,
            preferred=cfg.preferred_segment,
            rng=rng,
        )
        if len(names) == n:
            got = [(nm, dep.segments[nm].space.alloc(size)) for nm in names]
            if all(off is not None for _, off in got):
                return [(nm, off) for nm, off in got if off is not None]
            for nm, off in got:
                if off is not None:
                    dep.segments[nm].space.release(off, size)
        if not evict(dep, objs, now, drop, limit=1, segs={s.spec.name for s in segs}):
            return None


def evict(
    dep: DeploymentState,
    objs: Mapping[ObjKey, ObjectState],
    now: float,
    drop: Drop,
    *,
    until: Callable[[DeploymentState], bool] | None = None,
    limit: int = 0,
    segs: set[str] | None = None,
) -> list[ObjKey]:
    """Evict LRU-first until ``until(dep)`` or ``limit`` objects (0 = no limit), only objects
    with a replica on ``segs`` if given; soft pins last. Returns the evicted keys in order."""
    evicted: list[ObjKey] = []
    for allow_soft in (False, True):
        victims: list[ObjKey] = []
        for ok in dep.lru:
            obj = objs[ok]
            if obj.hard_pin or obj.lease_until > now or (obj.soft_pin and not allow_soft):
                continue
            if segs is not None and not any(r[0] in segs for r in obj.replicas):
                continue
            victims.append(ok)
            if limit and len(victims) + len(evicted) >= limit:
                break
        for ok in victims:
            if until is not None and until(dep):
                return evicted
            drop(ok)
            evicted.append(ok)
        if (limit and len(evicted) >= limit) or (until is not None and until(dep)):
            return evicted
    return evicted
