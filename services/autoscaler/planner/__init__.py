"""The SLA planner: a pure core (``on_tick``), predictors, capacity, stability, victims and
co-location rules; the reactive (KPA-like) policy beside it (``reactive_tick``), chosen by
``planner.policy`` (``decide``). The loop shell that feeds them is
:mod:`services.autoscaler.loop`."""

from services.autoscaler.planner.colocation import Claim, allocate, fit_roles
from services.autoscaler.planner.config import PlannerConfig, ReactiveConfig
from services.autoscaler.planner.core import Decision, finish, on_tick
from services.autoscaler.planner.inputs import (
    ClassView,
    PerfView,
    PlannerInputs,
    PlannerState,
    WindowView,
)
from services.autoscaler.planner.policy import decide
from services.autoscaler.planner.reactive import reactive_tick

__all__ = [
    "Claim",
    "ClassView",
    "Decision",
    "PerfView",
    "PlannerConfig",
    "PlannerInputs",
    "PlannerState",
    "ReactiveConfig",
    "WindowView",
    "allocate",
    "decide",
    "finish",
    "fit_roles",
    "on_tick",
    "reactive_tick",
]
