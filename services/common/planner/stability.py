"""Scale up fast, down slowly (pure).

Rule, per role, given its current target ``desired``:

* ``up`` = the replicas the demand needs now (``ceil(need) + boost``). Above ``desired``,
  the role goes there at once (pending instances count as capacity on the way, so a slow
  start never asks for more twice: no cascade).
* Below, scale-down is stabilised: its candidate is the largest ``down`` (the replicas
  the demand would need with ``hysteresis`` more traffic, + boost) seen over the last
  ``scale_down_window_s`` (nothing before the planner has watched a whole window), never
  within ``cooldown_s`` of the role's last change, and at most ``max_scale_down_step`` of the
  role per decision (at least 1) — except that zero traffic goes straight to the candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from services.common.planner.config import PlannerConfig

__all__ = ["RoleState", "Step", "stabilise"]


@dataclass(frozen=True)
class RoleState:
    first_seen: float | None = None
    last_change: float = -math.inf
    history: tuple[tuple[float, int], ...] = ()  # (ts, down candidate)
    boost: int = 0  # replicas added by attainment feedback


@dataclass(frozen=True)
class Step:
    target: int
    state: RoleState
    why: str  # "up", "down", "hold", "cooldown", "stabilising"


def stabilise(
    now: float,
    desired: int,
    up: int,
    down: int,
    idle: bool,
    state: RoleState,
    cfg: PlannerConfig,
    floor: int = 0,
) -> Step:
    """The role's next target (``floor``: its min_replicas; never planned below)."""
    first = now if state.first_seen is None else state.first_seen
    kept = [(ts, v) for ts, v in state.history if now - ts < cfg.scale_down_window_s]
    history = (*kept, (now, down))
    st = replace(state, first_seen=first, history=history)
    if up > desired:
        return Step(up, replace(st, last_change=now), "up")
    candidate = max(floor, *(v for _, v in history))
    if candidate >= desired:
        return Step(desired, st, "hold")
    if now - first < cfg.scale_down_window_s:
        return Step(desired, st, "stabilising")
    if now - state.last_change < cfg.cooldown_s:
        return Step(desired, st, "cooldown")
    if idle:
        return Step(candidate, replace(st, last_change=now), "down")
    step = max(1, math.floor(desired * cfg.max_scale_down_step))
    return Step(max(candidate, desired - step), replace(st, last_change=now), "down")
