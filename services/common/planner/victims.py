"""Which instances a shrinking role gives up (pure): the ones whose loss costs least.

Order: instances still starting first (no cache, nothing in flight: cancelling a launch is
free), then ready ones by cost = ``(in_flight + queued) * IN_FLIGHT_WEIGHT + cached_blocks
+ session_blocks * SESSION_BLOCK_WEIGHT`` ascending, ties by id for determinism. A request in
flight must be drained; a cached block is at most re-computed; a block of a live agent
session homed there must be moved before removal (written to the tier, fetched back where
the session's next turn lands: two transfers), so of two idle instances the one holding
less session KV goes first. Draining, stopped and failed instances are not counted: they
are already on their way out. The reconciler drains victims (and, with kvmeta configured,
migrates their sessions) before removal.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.planner.ports import InstanceView

__all__ = ["IN_FLIGHT_WEIGHT", "SESSION_BLOCK_WEIGHT", "active", "pick_victims"]

IN_FLIGHT_WEIGHT = 1000
SESSION_BLOCK_WEIGHT = 2


def active(instances: Sequence[InstanceView], role: str) -> list[InstanceView]:
    """Instances of ``role`` that count as capacity: ready or starting (pending)."""
    return [i for i in instances if i.role == role and i.state in ("ready", "starting")]


def _cost(i: InstanceView) -> tuple[int, int, str]:
    if i.state == "starting":
        return (0, 0, i.instance_id)
    load = (i.in_flight + i.queued) * IN_FLIGHT_WEIGHT + i.cached_blocks
    load += i.session_blocks * SESSION_BLOCK_WEIGHT
    return (1, load, i.instance_id)


def pick_victims(instances: Sequence[InstanceView], role: str, target: int) -> list[str]:
    """Ids to remove so that ``role`` has ``target`` active instances, cheapest first."""
    pool = sorted(active(instances, role), key=_cost)
    excess = len(pool) - max(0, target)
    return [i.instance_id for i in pool[: max(0, excess)]]
