"""Pre-emption planning (pure): which dispatched requests to take back for waiting ones.

Rule: lower classes may be pre-empted only before their first byte. A request that has
started streaming is never a candidate (:func:`choose_preemption` enforces both).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.admission.queue import AdmissionQueue, InFlight, choose_preemption

__all__ = ["plan_preemptions"]


def plan_preemptions(
    queue: AdmissionQueue,
    in_flight: Sequence[InFlight],
    *,
    capacity: int,
    saturated: bool,
    in_progress: int = 0,
    limit: int = 8,
) -> list[str]:
    """Request ids to pre-empt now, in order (at most ``limit``).

    Nothing when there is free ``capacity`` (the queue will be served without it) or when
    the fleet is ``saturated`` (a freed slot would not let anything in). Otherwise victims
    are chosen one at a time by :func:`choose_preemption`, and only while the requests
    waiting in classes strictly above the victim's outnumber the slots already being
    freed (``in_progress`` pre-emptions not yet completed plus the victims chosen so far),
    so each waiting request costs at most one pre-emption."""
    if capacity > 0 or saturated or limit <= 0:
        return []
    pool = list(in_flight)
    classes = queue.config.classes
    victims: list[str] = []
    while len(victims) < limit:
        vid = choose_preemption(queue, pool)
        if vid is None:
            break
        victim = next(f for f in pool if f.request_id == vid)
        above = sum(queue.depth(c.name) for c in classes if c.priority > victim.priority)
        if above <= in_progress + len(victims):
            break
        victims.append(vid)
        pool.remove(victim)
    return victims
