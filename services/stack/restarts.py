"""When ``tideserve up`` restarts a service that died (pure).

Rule: a service (not an engine: engines belong to the autoscaler's deployment and its
restart policy) that exits while the stack runs is started again: at once the first time,
then after a back-off doubling from ``base_delay_s`` up to ``max_delay_s`` for each restart
still inside the last ``window_s``. Once it has been restarted ``max_restarts`` times within
``window_s`` it is crash-looping: no more restarts, and the stack stops as it would without
restarts. ``max_restarts = 0`` turns restarts off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.planner.driver_base import backoff_s

__all__ = ["RestartPlan", "RestartPolicy", "plan_restart"]


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    window_s: float = 60.0
    base_delay_s: float = 0.5
    max_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ValueError("max_restarts must be >= 0 and window_s > 0")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")


@dataclass(frozen=True)
class RestartPlan:
    restart: bool
    delay_s: float
    history: tuple[float, ...]
    """The restart times inside the window, the planned one included (when ``restart``)."""


def plan_restart(history: Sequence[float], now: float, policy: RestartPolicy) -> RestartPlan:
    """Whether (and after what delay) to restart a service that died at ``now``, given the
    times of its earlier restarts (``history``, monotonic seconds)."""
    recent = tuple(t for t in history if now - t < policy.window_s)
    if len(recent) >= policy.max_restarts:
        return RestartPlan(False, 0.0, recent)
    delay = backoff_s(len(recent), policy.base_delay_s, policy.max_delay_s)
    return RestartPlan(True, delay, (*recent, now + delay))
