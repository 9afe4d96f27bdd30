"""Which policy decides a tick: ``planner.policy`` (``sla``: :func:`.core.on_tick`, the SLA
planner; ``reactive``: :func:`.reactive.reactive_tick`, the KPA-like baseline). Pure."""

from __future__ import annotations

from services.common.planner.config import PlannerConfig
from services.common.planner.core import Decision, on_tick
from services.common.planner.inputs import PlannerInputs
from services.common.planner.reactive import reactive_tick

__all__ = ["decide"]


def decide(now: float, inputs: PlannerInputs, cfg: PlannerConfig) -> Decision:
    """The configured policy's decision for ``inputs`` at ``now``."""
    if cfg.policy == "reactive":
        return reactive_tick(now, inputs, cfg)
    return on_tick(now, inputs, cfg)
