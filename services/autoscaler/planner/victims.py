"""Which instances a shrinking role gives up (pure): the ones whose loss costs least.

Order: instances still starting first (no cache, nothing in flight: cancelling a launch is
free), then ready ones by cost = ``in_flight * IN_FLIGHT_WEIGHT + queued * IN_FLIGHT_WEIGHT
+ cached_blocks`` ascending (a request in flight must be drained, a cached block only
re-computed), ties by id for determinism. Draining, stopped and failed instances are not
counted: they are already on their way out. The reconciler drains victims before removal.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.autoscaler.ports import InstanceView

__all__ = ["IN_FLIGHT_WEIGHT", "active", "pick_victims"]

IN_FLIGHT_WEIGHT = 1000


def active(instances: Sequence[InstanceView], role: str) -> list[InstanceView]:
    """Instances of ``role`` that count as capacity: ready or starting (pending)."""
    return [i for i in instances if i.role == role and i.state in ("ready", "starting")]


def _cost(i: InstanceView) -> tuple[int, int, str]:
    if i.state == "starting":
        return (0, 0, i.instance_id)
    load = (i.in_flight + i.queued) * IN_FLIGHT_WEIGHT + i.cached_blocks
    return (1, load, i.instance_id)


def pick_victims(instances: Sequence[InstanceView], role: str, target: int) -> list[str]:
    """Ids to remove so that ``role`` has ``target`` active instances, cheapest first."""
    pool = sorted(active(instances, role), key=_cost)
    excess = len(pool) - max(0, target)
    return [i.instance_id for i in pool[: max(0, excess)]]
