"""The SLA planner: a pure core (``on_tick``), predictors, capacity, stability, victims and
co-location rules. The loop shell that feeds it is :mod:`services.autoscaler.loop`."""

from services.autoscaler.planner.colocation import Claim, allocate, fit_roles
from services.autoscaler.planner.config import PlannerConfig
from services.autoscaler.planner.core import Decision, finish, on_tick
from services.autoscaler.planner.inputs import (
    ClassView,
    PerfView,
    PlannerInputs,
    PlannerState,
    WindowView,
)

__all__ = [
    "Claim",
    "ClassView",
    "Decision",
    "PerfView",
    "PlannerConfig",
    "PlannerInputs",
    "PlannerState",
    "WindowView",
    "allocate",
    "finish",
    "fit_roles",
    "on_tick",
]
