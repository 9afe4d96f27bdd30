"""Prometheus metrics of the autoscaler (names are a contract: a dashboard uses them)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.common.planner.ports import InstanceView
from services.common.planner.records import RoleChange

__all__ = ["AutoscalerMetrics"]

_STATES = ("desired", "starting", "ready", "draining", "failed")


class AutoscalerMetrics:
    """``tideserve_autoscaler_replicas{deployment, role, state}`` (state: desired, starting,
    ready, draining, failed) and ``tideserve_autoscaler_decisions_total{deployment, role,
    direction}`` (direction: up, down)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.replicas = Gauge(
            "tideserve_autoscaler_replicas",
            "Replicas of a deployment's role by state (desired = the planner's target).",
            ["deployment", "role", "state"],
            registry=registry,
        )
        self.decisions = Counter(
            "tideserve_autoscaler_decisions_total",
            "Scaling decisions that changed a role's target, by direction.",
            ["deployment", "role", "direction"],
            registry=registry,
        )

    def observe(
        self,
        deployment: str,
        targets: Mapping[str, int],
        instances: Sequence[InstanceView],
        changes: Sequence[RoleChange],
    ) -> None:
        for role, n in targets.items():
            counts = {s: 0 for s in _STATES}
            counts["desired"] = n
            for i in instances:
                if i.role == role and i.state in counts:
                    counts[i.state] += 1
            for state, value in counts.items():
                self.replicas.labels(deployment, role, state).set(value)
        for c in changes:
            direction = "up" if c.to_replicas > c.from_replicas else "down"
            self.decisions.labels(deployment, c.role, direction).inc()

    def forget(self, deployment: str, roles: Sequence[str]) -> None:
        for role in roles:
            for state in _STATES:
                with contextlib.suppress(KeyError):
                    self.replicas.remove(deployment, role, state)
