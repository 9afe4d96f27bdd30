"""The SLA planner: ``on_tick(now, inputs) -> Decision``. Pure: no I/O, time is ``now``.

Per tick, for each role of the deployment:

1. Forecast: the window's request rate feeds the configured predictor
   (:mod:`.forecast`); the role plans for the rate now times the growth the forecast
   expects by now + lead (never less than now), where lead = the role's measured start-up
   time + one tick (scale ahead of the tide). With ``rate_trend`` it plans for at least
   the window's rate carried along its recent climb to now + lead (:mod:`.trend`).
2. Capacity (:mod:`.capacity`): prefill from the uncached prompt tokens at the TTFT target
   plus the queue backlog (queued requests on ready instances; warming instances are
   ignored) drained within it; decode from concurrency and context at the TPOT target;
   workers both. Each SLO class is sized at its own percentile; the largest need binds.
3. Attainment feedback: if the observed TTFT/TPOT at the class's percentile misses its
   target, the role gets a boost of replicas on top of the model (one step per tick, only
   while nothing of that role is still starting and its last change is older than a window
   plus the lead time — the window must show the current fleet — so a slow start never
   cascades); the boost
   decays one replica per tick once the observed figure is under ``boost_relief`` x target.
4. Stability (:mod:`.stability`): up at once, down stabilised, cooled down, with hysteresis
   and a step limit; zero traffic goes to min. With ``session_kv_floor`` a scale-in stops
   at the instances whose KV holds the role's active agent sessions' prefixes
   (:mod:`.sessionkv`; binding ``<role>:session-kv``).
5. Coordination: P:D ratio bounds (raising the short side), min/max, the replica budget
   (:func:`.colocation.fit_roles`).
6. Manual pins (``tideserve scale``): a pinned role is held at its pin, whatever the above.
7. Victims (:mod:`.victims`): the cheapest instances of each shrinking role, to drain first.

A telemetry outage holds every role at its current target (clamped to min/max and
budget) and says so; a role kind with no fitted model uses the spec's ``perf_profile``
prior, and without either holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from services.common.perfmodel import get_profile
from services.common.planner.capacity import (
    Demand,
    FirstChunk,
    PerfLike,
    Targets,
    decode_need,
    prefill_need,
)
from services.common.planner.colocation import fit_roles
from services.common.planner.config import PlannerConfig
from services.common.planner.forecast import error, new_forecaster, observe, predict
from services.common.planner.inputs import PerfView, PlannerInputs, PlannerState, WindowView
from services.common.planner.records import RoleChange
from services.common.planner.sessionkv import SessionFloor, session_floor
from services.common.planner.spec import DeploymentSpec, RoleSpec, SLOClassSpec
from services.common.planner.stability import RoleState, stabilise
from services.common.planner.trend import ahead_of_window, follow
from services.common.planner.victims import active, pick_victims

__all__ = [
    "Decision",
    "apply_ratio_bounds",
    "clamp_role",
    "finish",
    "on_tick",
    "perf_for",
    "role_floor",
]

_EPS = 1e-9


@dataclass(frozen=True)
class Decision:
    deployment: str
    generation: int
    now: float
    targets: Mapping[str, int]
    changes: tuple[RoleChange, ...]
    victims: tuple[str, ...]
    reasons: tuple[str, ...]
    binding: str
    forecast: Mapping[str, Any]
    inputs: Mapping[str, Any]
    state: PlannerState

    @property
    def total(self) -> int:
        return sum(self.targets.values())


def clamp_role(role: RoleSpec, n: int) -> int:
    return min(role.max_replicas, max(role.min_replicas, n))


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


def perf_for(inp: PlannerInputs, kind: str) -> tuple[PerfLike | None, str]:
    if kind in inp.perf:
        perf = inp.perf[kind]
        # a fitted model learns step times, not memory: the prior's KV capacity bounds it
        if isinstance(perf, PerfView) and not perf.kv_tokens and inp.spec.perf_profile:
            kv = get_profile(inp.spec.perf_profile).kv_capacity_tokens
            perf = replace(perf, kv_tokens=kv)
        return perf, "fitted"
    if inp.spec.perf_profile:
        return get_profile(inp.spec.perf_profile), f"prior:{inp.spec.perf_profile}"
    return None, "none"


def _classes(spec: DeploymentSpec) -> Sequence[SLOClassSpec]:
    with_targets = [c for c in spec.slo_classes if c.ttft_ms or c.tpot_ms]
    return with_targets or [SLOClassSpec(name="default")]


def _need(
    role: RoleSpec, perf: PerfLike, demand: Demand, spec: DeploymentSpec, cfg: PlannerConfig
) -> tuple[float, str, str]:
    """(replicas, binding, detail) of the class that needs most."""
    best = (-1.0, "", "")
    for c in _classes(spec):
        t = Targets(c.ttft_ms, c.tpot_ms, c.percentile)
        parts = []
        first = FirstChunk(cfg.stream_interval, cfg.first_chunk_share)
        if role.role in ("prefill", "worker"):
            need = prefill_need(perf, demand, t, cfg.max_utilization, first, cfg.decode_headroom)
            parts.append(("ttft", need))
        if role.role in ("decode", "worker"):
            parts.append(("tpot", decode_need(perf, demand, t, cfg.decode_headroom, first)))
        total = sum(n.replicas for _, n in parts)
        metric, _ = max(parts, key=lambda p: p[1].replicas)
        if total > best[0]:
            flag = "" if all(n.feasible for _, n in parts) else " INFEASIBLE"
            detail = "; ".join(f"{m} {n.detail}" for m, n in parts) + flag
            best = (total, f"{role.name}:{metric}:{c.name}", detail)
    return best


def _feedback(
    role: RoleSpec,
    w: WindowView,
    spec: DeploymentSpec,
    rs: RoleState,
    desired: int,
    pending: bool,
    relief: float,
) -> tuple[int, str]:
    """The attainment boost after this window (see the module rule) and why."""
    metrics = {"prefill": ("ttft",), "decode": ("tpot",), "worker": ("ttft", "tpot")}.get(
        role.role, ()
    )
    boost = rs.boost
    if w.requests == 0 or not metrics:
        return boost, ""
    missed, relieved = [], True
    for c in spec.slo_classes:
        for m in metrics:
            target = c.ttft_ms if m == "ttft" else c.tpot_ms
            seen = w.at(m, c.percentile, c.name)
            if not target or seen is None:
                continue
            if seen > target:
                missed.append(
                    f"{m} p{c.percentile:g} {seen:.0f}ms > target {target:g}ms ({c.name})"
                )
            if seen >= target * relief:
                relieved = False
    if missed and not pending:
        add = max(1, math.ceil(0.1 * desired))
        return boost + add, f"attainment: {missed[0]}: +{add}"
    if missed:
        return boost, f"attainment: {missed[0]}: capacity still arriving, no extra"
    if relieved and boost:
        return boost - 1, "attainment met with margin: boost -1"
    return boost, ""


def role_floor(
    inputs: PlannerInputs, role: RoleSpec, perf: PerfLike, cfg: PlannerConfig
) -> SessionFloor:
    """The role's scale-in floor from its instances' active sessions (0 when off)."""
    tokens = sum(i.active_session_tokens for i in inputs.instances if i.role == role.name)
    kv = inputs.kv_tokens.get(role.role) or perf.kv_capacity_tokens
    if not cfg.session_kv_floor:
        return SessionFloor(0, tokens, kv, cfg.session_kv_headroom)
    return session_floor(tokens, kv, cfg.session_kv_headroom)


def _planned_rate(observed: float, ahead: float | None, current: float | None) -> float:
    """The rate to plan for: the observed rate times the growth the forecast expects
    between the current bucket and ``now + lead`` (never below observed). Applying the
    forecast's growth rather than its level keeps a biased level from costing replicas;
    with nothing observed (or no forecast of the current bucket) the forecast itself."""
    if ahead is None:
        return observed
    if observed > 0 and current:
        return max(observed, observed * ahead / current)
    return max(observed, ahead)


def apply_ratio_bounds(spec: DeploymentSpec, targets: dict[str, int]) -> str:
    """Raise the short side to meet the P:D ratio bounds; returns a reason or ""."""
    lo, hi = spec.coordination.min_pd_ratio, spec.coordination.max_pd_ratio
    pre, dec = spec.roles_of("prefill"), spec.roles_of("decode")
    if not (lo or hi) or not pre or not dec:
        return ""
    p = sum(targets[r.name] for r in pre)
    d = sum(targets[r.name] for r in dec)
    if lo and p < lo * d - _EPS:
        for r in pre:
            while p < lo * d - _EPS and targets[r.name] < r.max_replicas:
                targets[r.name] += 1
                p += 1
        return f"pd-ratio: prefill raised to {p} for min P:D {lo:g} (decode {d})"
    if hi and p > hi * d + _EPS:
        for r in dec:
            while p > hi * d + _EPS and targets[r.name] < r.max_replicas:
                targets[r.name] += 1
                d += 1
        return f"pd-ratio: decode raised to {d} for max P:D {hi:g} (prefill {p})"
    return ""


def on_tick(now: float, inputs: PlannerInputs, cfg: PlannerConfig | None = None) -> Decision:
    """Decide every role's target for ``inputs`` at ``now`` (see the module docstring)."""
    cfg = cfg or PlannerConfig()
    spec, w = inputs.spec, inputs.window
    desired = {r.name: clamp_role(r, inputs.desired.get(r.name, r.replicas)) for r in spec.roles}
    fc = inputs.state.forecaster or new_forecaster(cfg)
    if w is None:
        why = inputs.telemetry_error or "no window"
        held = [f"telemetry unavailable ({why}): holding current targets"]
        state = replace(inputs.state, forecaster=fc)
        return finish(now, inputs, desired, held, "telemetry-outage", cfg, state, {})
    fc = observe(fc, now, w.rate_rps)
    trend = follow(inputs.state.trend, now, w.rate_rps, cfg.interval_s)
    targets: dict[str, int] = {}
    bindings: list[str] = []
    reasons: list[str] = []
    roles_state = dict(inputs.state.roles)
    horizons: dict[str, Any] = {}
    for role in spec.roles:
        perf, source = perf_for(inputs, role.role)
        if role.role == "kvcache" or perf is None:
            targets[role.name] = desired[role.name]
            why = "not planned" if role.role == "kvcache" else "no perf model or perf_profile"
            reasons.append(f"{role.name}: holding {desired[role.name]} ({why})")
            continue
        startup = inputs.startup_s.get(role.role) or cfg.startup_s_default
        lead = startup + cfg.interval_s
        ahead = predict(fc, now, lead)
        rate = _planned_rate(w.rate_rps, ahead, predict(fc, now, 0.0))
        if cfg.rate_trend:
            rate = max(rate, ahead_of_window(trend, w.rate_rps, cfg.window_s, lead))
        horizons[role.name] = {"lead_s": lead, "rate_rps": ahead, "trend": trend.slope}
        ready = [i for i in active(inputs.instances, role.name) if i.state == "ready"]
        backlog = float(sum(i.queued for i in ready)) if role.role != "decode" else 0.0
        demand = Demand(rate, w.input_tokens, w.output_tokens, w.hit_ratio, backlog, lead)
        need, binding, detail = _need(role, perf, demand, spec, cfg)
        margin = replace(demand, rate_rps=rate * (1 + cfg.hysteresis))
        need_down = _need(role, perf, margin, spec, cfg)[0]
        share = len(spec.roles_of(role.role))
        need, need_down = need / share, need_down / share
        rs = roles_state.get(role.name, RoleState())
        pending = any(i.state == "starting" for i in active(inputs.instances, role.name))
        # capacity added within the last window + lead is not yet reflected in the window
        pending = pending or now - rs.last_change < cfg.window_s + lead
        boost, boost_why = _feedback(
            role, w, spec, rs, desired[role.name], pending, cfg.boost_relief
        )
        if boost > rs.boost:
            binding = f"{role.name}:attainment"
        up = _ceil(need) + boost
        down = _ceil(need_down) + boost
        idle = w.rate_rps <= 0 and not ahead
        have, rs_now = desired[role.name], replace(rs, boost=boost)
        step = stabilise(now, have, up, down, idle, rs_now, cfg, role.min_replicas)
        floor = role_floor(inputs, role, perf, cfg)
        lowest = max(role.min_replicas, min(floor.replicas, have))
        if step.target < lowest:  # the scale-in would leave the active sessions no room
            step = stabilise(now, have, up, down, idle, rs_now, cfg, lowest)
            binding = f"{role.name}:session-kv"
            boost_why = "; ".join(x for x in (boost_why, floor.why()) if x)
        roles_state[role.name] = step.state
        targets[role.name] = clamp_role(role, step.target)
        if targets[role.name] != step.target:
            binding = f"{role.name}:{'max' if step.target > role.max_replicas else 'min'}-replicas"
        bindings.append(binding)
        reasons.append(
            f"{role.name}: {desired[role.name]} -> {targets[role.name]} ({step.why}); "
            f"need {need:.2f} for {rate:.2f} req/s [{detail}] ({source})"
            + (f"; {boost_why}" if boost_why else "")
        )
    ratio_why = apply_ratio_bounds(spec, targets)
    if ratio_why:
        reasons.append(ratio_why)
        bindings.append("pd-ratio")
    state = PlannerState(forecaster=fc, roles=roles_state, trend=trend)
    return finish(now, inputs, targets, reasons, ", ".join(bindings), cfg, state, horizons)


def finish(
    now: float,
    inputs: PlannerInputs,
    targets: Mapping[str, int],
    reasons: Sequence[str],
    binding: str,
    cfg: PlannerConfig,
    state: PlannerState,
    horizons: Mapping[str, Any],
    limit: int | None = None,
) -> Decision:
    """Apply the budget (the spec's, or ``limit`` from a shared group), then the manual pins
    (the operator's word: held even over the budget, as ``ScaleRole`` itself), pick victims,
    and build the decision. Used again by the co-location step with a group ``limit``."""
    spec = inputs.spec
    out = dict(targets)
    notes = list(reasons)
    caps = [c for c in (spec.budget.max_replicas or None, limit) if c is not None]
    if caps and sum(out.values()) > min(caps):
        cap = min(caps)
        out = fit_roles(spec, out, cap)
        which = "budget group" if limit is not None and cap == limit else "budget"
        notes.append(f"{which}: {sum(targets.values())} wanted, {sum(out.values())} kept")
        binding = which if not binding else f"{binding}, {which}"
    pinned = {
        r.name: clamp_role(r, inputs.pins[r.name]) for r in spec.roles if r.name in inputs.pins
    }
    if pinned:
        out.update(pinned)
        held = ", ".join(f"{n} {v}" for n, v in sorted(pinned.items()))
        notes.append(f"manual pin: {held} (tideserve scale; until a changed apply or --release)")
        binding = f"{binding}, manual" if binding and binding != "none" else "manual"
    desired = {r.name: clamp_role(r, inputs.desired.get(r.name, r.replicas)) for r in spec.roles}
    changes = tuple(
        RoleChange(name, desired[name], out[name]) for name in out if out[name] != desired[name]
    )
    victims: list[str] = []
    for name, n in out.items():
        victims.extend(pick_victims(inputs.instances, name, n))
    fc = state.forecaster
    forecast: dict[str, Any] = {"policy": cfg.policy, "horizons": dict(horizons)}
    if cfg.policy == "sla":
        forecast["predictor"] = cfg.predictor
    if fc is not None:
        e = error(fc)
        forecast.update(mae_rps=e.mae, mape=e.mape, scored_buckets=e.scored)
    return Decision(
        deployment=spec.name,
        generation=spec.generation,
        now=now,
        targets=out,
        changes=changes,
        victims=tuple(victims),
        reasons=tuple(notes),
        binding=binding or "none",
        forecast=forecast,
        inputs=_summary(inputs, desired),
        state=state,
    )


def _summary(inputs: PlannerInputs, desired: Mapping[str, int]) -> dict[str, Any]:
    w = inputs.window
    counts: dict[str, dict[str, int]] = {}
    for i in inputs.instances:
        counts.setdefault(i.role, {}).setdefault(i.state, 0)
        counts[i.role][i.state] += 1
    out: dict[str, Any] = {"desired": dict(desired), "instances": counts}
    if w is None:
        out["telemetry_error"] = inputs.telemetry_error
    else:
        out["window"] = {
            "requests": w.requests,
            "rate_rps": w.rate_rps,
            "input_tokens": w.input_tokens,
            "output_tokens": w.output_tokens,
            "hit_ratio": w.hit_ratio,
            "ttft_ms": {str(k): v for k, v in w.ttft_ms.items()},
            "tpot_ms": {str(k): v for k, v in w.tpot_ms.items()},
        }
    out["perf"] = sorted(inputs.perf)
    out["startup_s"] = dict(inputs.startup_s)
    return out
