"""The planner loop: the shell around the configured policy's core
(:func:`services.common.planner.decide`: the SLA planner's ``on_tick`` or the reactive
``reactive_tick``).

Every ``interval_s``: for each stored deployment in its scope (``managed_deployments``) read telemetry (one window, one perf model
per role kind), the instances from the :class:`Reconciler`, run the core (then the
co-location step per budget group), store the decision, and hand the targets and victims
to the reconciler — unless ``advisory`` (dry-run: decided and stored as "dry-run"; the
desired counts follow the advice, so ``describe`` shows desired vs the untouched actual,
and nothing is handed to the reconciler). A telemetry error never stops the loop: the core is told the window is missing
(and why) and holds its targets, saying so in the reason. A reconciler error marks the
decision "failed" with the error in its reasons; the next tick decides again.

Decisions that change a target or list victims are always stored; a decision that changes
nothing is stored at most every ``hold_record_s`` per deployment (so ``describe`` shows
the current reasoning without a row every tick).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from services.autoscaler.metrics import AutoscalerMetrics
from services.autoscaler.scope import EVERY, Scope
from services.autoscaler.store import AutoscalerStore, StoredDeployment
from services.autoscaler.telemetry import TelemetryReader
from services.common.planner import (
    Decision,
    PlannerConfig,
    PlannerInputs,
    PlannerState,
    decide,
)
from services.common.planner.capacity import PerfLike
from services.common.planner.config import for_deployment
from services.common.planner.group import plan_group
from services.common.planner.ports import ReconcileError, Reconciler
from services.common.planner.records import DecisionRecord
from services.common.streams.codec import one_line
from services.common.tasks import pause

__all__ = ["LoopOptions", "PlannerLoop", "to_record"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopOptions:
    advisory: bool = False
    budget_groups: Mapping[str, int] | None = None  # group -> replicas shared
    hold_record_s: float = 300.0
    scope: Scope = EVERY  # the deployments planned here (managed_deployments)


def to_record(d: Decision, status: str, wall_ms: int) -> DecisionRecord:
    return DecisionRecord(
        decision_id=uuid.uuid4().hex,
        deployment=d.deployment,
        generation=d.generation,
        ts_ms=wall_ms,
        changes=d.changes,
        reasons=d.reasons,
        binding_constraint=d.binding,
        status=status,
        victims=d.victims,
        inputs=d.inputs,
        forecast=d.forecast,
    )


class PlannerLoop:
    def __init__(
        self,
        store: AutoscalerStore,
        reconciler: Reconciler,
        telemetry: TelemetryReader,
        cfg: PlannerConfig,
        options: LoopOptions,
        metrics: AutoscalerMetrics,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self._store = store
        self._reconciler = reconciler
        self._telemetry = telemetry
        self._cfg = cfg
        self._opts = options
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._states: dict[str, PlannerState] = {}
        self._last_hold: dict[str, float] = {}

    async def inputs(self, dep: StoredDeployment) -> PlannerInputs:
        """One deployment's snapshot; telemetry failures become a missing window."""
        spec = dep.spec
        perf: dict[str, PerfLike] = {}
        startup: dict[str, float] = {}
        window = None
        error = ""
        try:
            window = await self._telemetry.window(spec.name, self._cfg.window_s)
            for kind in sorted({r.role for r in spec.roles} - {"kvcache"}):
                model = await self._telemetry.perf(spec.name, kind)
                if model is not None:
                    perf[kind] = model
                    if model.startup_s > 0:
                        startup[kind] = model.startup_s
        except Exception as exc:  # any telemetry failure: decide on what is known
            error = f"{type(exc).__name__}: {one_line(exc)}"
            window = None
        return PlannerInputs(
            spec=spec,
            desired=dict(dep.desired),
            instances=tuple(self._reconciler.instances(spec.name)),
            window=window,
            perf=perf,
            startup_s=startup,
            state=self._states.get(spec.name, PlannerState()),
            telemetry_error=error,
            pins=dict(dep.pins),
        )

    async def _decide(
        self, deployments: list[StoredDeployment]
    ) -> tuple[dict[str, PlannerInputs], dict[str, Decision]]:
        now = self._clock()
        inputs = {d.spec.name: await self.inputs(d) for d in deployments}
        decisions = {
            n: decide(now, i, for_deployment(self._cfg, i.spec.planner.overrides()))
            for n, i in inputs.items()
        }
        groups: dict[str, list[str]] = defaultdict(list)
        for name, i in inputs.items():
            if i.spec.budget.group:
                groups[i.spec.budget.group].append(name)
        budgets = self._opts.budget_groups or {}
        for group, names in groups.items():
            if group not in budgets:
                continue  # no shared budget configured: each keeps its own
            sub = plan_group(
                now,
                group,
                budgets[group],
                {n: inputs[n] for n in names},
                {n: decisions[n] for n in names},
                self._cfg,
            )
            decisions.update(sub)
        return inputs, decisions

    async def _managed(self) -> list[StoredDeployment]:
        return [d for d in await self._store.all() if self._opts.scope.manages(d.spec.name)]

    async def plan(self, name: str) -> Decision | None:
        """What the planner would decide now for ``name`` (nothing stored or advanced; None
        unless it is stored and managed here)."""
        deployments = await self._managed()
        if name not in {d.spec.name for d in deployments}:
            return None
        _, decisions = await self._decide(deployments)
        return decisions[name]

    async def tick(self) -> list[DecisionRecord]:
        """One pass over every managed deployment; returns the records it stored."""
        deployments = await self._managed()
        inputs, decisions = await self._decide(deployments)
        stored: list[DecisionRecord] = []
        for name, d in decisions.items():
            self._states[name] = d.state
            record = await self._carry_out(inputs[name], d)
            if record is not None:
                stored.append(record)
        for gone in set(self._states) - set(decisions):
            state = self._states.pop(gone)
            self._metrics.forget(gone, sorted(state.roles))
            self._last_hold.pop(gone, None)
        return stored

    async def _carry_out(self, inputs: PlannerInputs, d: Decision) -> DecisionRecord | None:
        acts = bool(d.changes or d.victims)
        now = self._clock()
        if not acts and now - self._last_hold.get(d.deployment, -1e18) < self._opts.hold_record_s:
            self._metrics.observe(d.deployment, d.targets, inputs.instances, ())
            return None
        if not acts:
            self._last_hold[d.deployment] = now
        status = "dry-run" if self._opts.advisory else ("applied" if acts else "planned")
        reasons = d.reasons
        if acts and not self._opts.advisory:
            try:
                await self._reconciler.apply(
                    inputs.spec, d.targets, d.victims, reason=f"planner: {'; '.join(d.reasons)}"
                )
                await self._store.set_desired(d.deployment, d.targets)
            except ReconcileError as exc:
                status, reasons = "failed", (*reasons, f"reconciler: {exc}")
            except Exception as exc:  # a driver bug must not stop the loop
                log.exception("reconciler failed for %s", d.deployment)
                status, reasons = "failed", (*reasons, f"reconciler: {one_line(exc)}")
        elif acts:
            await self._store.set_desired(d.deployment, d.targets)
        record = replace(to_record(d, status, int(self._wall() * 1000)), reasons=tuple(reasons))
        await self._store.add_decision(record)
        applied = d.changes if status in ("applied", "dry-run") else ()
        self._metrics.observe(d.deployment, d.targets, inputs.instances, applied)
        return record

    async def run(self, stopping: asyncio.Event) -> None:
        """Tick every ``interval_s`` until ``stopping`` is set; a failed tick is logged and
        the next one runs (e.g. Postgres briefly away)."""
        while not stopping.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("planner tick failed")
            if await pause(stopping, self._cfg.interval_s):
                return
