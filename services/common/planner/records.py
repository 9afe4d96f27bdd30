"""Stored scaling decisions: the frozen record the store writes and the RPCs show.

``status``: "planned" (decided, not yet handed over), "applied" (handed to the reconciler),
"failed" (the reconciler refused; the reason says why), "dry-run" (advisory mode), "plan"
(the Plan RPC's answer, never stored).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STATUSES", "DecisionRecord", "RoleChange"]

STATUSES = ("planned", "applied", "failed", "dry-run", "plan")


@dataclass(frozen=True)
class RoleChange:
    role: str
    from_replicas: int
    to_replicas: int


@dataclass(frozen=True)
class DecisionRecord:
    decision_id: str
    deployment: str
    generation: int
    ts_ms: int
    changes: tuple[RoleChange, ...]
    reasons: tuple[str, ...]
    binding_constraint: str
    status: str
    victims: tuple[str, ...] = ()
    inputs: Mapping[str, Any] = field(default_factory=dict)
    forecast: Mapping[str, Any] = field(default_factory=dict)

    def targets(self) -> dict[str, int]:
        """``{role: to_replicas}`` of every change."""
        return {c.role: c.to_replicas for c in self.changes}
