"""The SLA planner: a pure core (``on_tick``), predictors, capacity, stability, victims and
co-location rules; the reactive (KPA-like) policy beside it (``reactive_tick``), chosen by
``planner.policy`` (``decide``). The loop shell that feeds them is
:mod:`services.autoscaler.loop`."""

from services.common.planner.colocation import Claim, allocate, fit_roles
from services.common.planner.config import PlannerConfig, ReactiveConfig
from services.common.planner.core import Decision, finish, on_tick
from services.common.planner.inputs import (
    ClassView,
    PerfView,
    PlannerInputs,
    PlannerState,
    WindowView,
)
from services.common.planner.policy import decide
from services.common.planner.reactive import reactive_tick

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
