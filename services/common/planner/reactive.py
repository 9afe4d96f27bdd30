"""The reactive policy: a KPA-like threshold autoscaler, ``reactive_tick(now, inputs, cfg)``.
Pure: no I/O, time is ``now``. Chosen by ``planner.policy: reactive`` (the SLA planner,
:func:`.core.on_tick`, is ``sla``); a baseline with no forecast, no queueing model and no
SLO percentile, shaped like Knative's KPA (and AIBrix's).

Rule, per role, each tick:

1. **Concurrency** (requests in flight on the role): the larger of what its ready engines
   report now (running + queued, scraped from their ``/metrics``, as a KPA's queue-proxy
   reports) and Little's law on the telemetry window (prefill = rate x TTFT p50; decode =
   rate x output tokens x TPOT p50; worker = both), which also sees requests waiting in the
   gateway but lags: a record exists only once its request finished. TTFT includes the
   queue, so an overloaded fleet shows more concurrency. The sample is kept with ``now``.
2. **Target per replica** = ``target_concurrency`` (0: derived from the perf model: prefill
   1, one prompt at a time; decode the largest batch whose step fits the TPOT target x
   ``decode_headroom``; worker 1 + output x step(1) / prefill, the decode riding along one
   busy prefill slot, step(1) at most the TPOT target) x ``target_utilization``. As with
   Knative, a measured ``target_concurrency`` (a load test) is the better setting.
3. **Wanted** = ceil(mean concurrency / target) over the stable window and over the panic
   window. Panic starts when the panic window wants ``panic_threshold`` x the ready
   replicas (at least 1) and lasts a stable window after the last time it did; while
   panicking the role never shrinks (wanted = max(panic want, current)).
4. **Bounded rates**: at most ``ceil(max_scale_up_rate x ready)`` and at least
   ``floor(ready / max_scale_down_rate)`` (ready: instances still starting are ignored).
   Then min/max, the P:D ratio bounds and the budget, and victims, as the SLA planner.

Zero traffic: concurrency 0, so the stable window drains to min (no scale-to-zero grace).
A telemetry outage holds every role, like the SLA planner; a role kind with no model and no
``target_concurrency`` holds and says so.
"""

from __future__ import annotations

import math
from dataclasses import replace

from services.common.planner.capacity import PerfLike, max_batch
from services.common.planner.config import PlannerConfig, ReactiveConfig
from services.common.planner.core import (
    Decision,
    apply_ratio_bounds,
    clamp_role,
    finish,
    perf_for,
)
from services.common.planner.inputs import PlannerInputs, ReactiveState, WindowView
from services.common.planner.spec import DeploymentSpec
from services.common.planner.victims import active

__all__ = ["concurrency", "per_replica", "reactive_tick"]


def concurrency(kind: str, w: WindowView) -> float:
    """Requests in flight on a role of ``kind`` by Little's law on ``w`` (rule 1)."""
    if w.requests == 0 or w.rate_rps <= 0:
        return 0.0
    ttft = w.ttft_ms.get(50, 0.0) / 1000.0
    decode = w.output_tokens * w.tpot_ms.get(50, 0.0) / 1000.0
    seconds = {"prefill": ttft, "decode": decode, "worker": ttft + decode}.get(kind, 0.0)
    return w.rate_rps * seconds


def _tightest_tpot(spec: DeploymentSpec) -> float:
    targets = [c.tpot_ms for c in spec.slo_classes if c.tpot_ms > 0]
    return min(targets) if targets else 0.0


def per_replica(
    kind: str, perf: PerfLike | None, w: WindowView, spec: DeploymentSpec, cfg: PlannerConfig
) -> float:
    """Concurrency a replica of ``kind`` is run at (rule 2); 0 when it cannot be known."""
    rc = cfg.reactive
    if rc.target_concurrency > 0:
        return rc.target_concurrency * rc.target_utilization
    if perf is None:
        return 0.0
    ctx = max(1, round(w.input_tokens + w.output_tokens / 2))
    if kind == "prefill":
        full = 1.0
    elif kind == "decode":
        tpot = _tightest_tpot(spec)
        budget = tpot * cfg.decode_headroom if tpot else 4.0 * perf.decode_step_ms(1, ctx)
        full = float(max(1, max_batch(perf, ctx, budget)))
    else:
        prefill = perf.prefill_ms(max(1, round(w.input_tokens)))
        tpot = _tightest_tpot(spec)
        step = perf.decode_step_ms(1, ctx)
        step = min(step, tpot) if tpot else step
        full = 1.0 + (w.output_tokens * step / prefill if prefill > 0 else 0.0)
    return full * rc.target_utilization


def _mean(samples: tuple[tuple[float, float], ...], since: float) -> float:
    xs = [c for ts, c in samples if ts > since]
    return sum(xs) / len(xs) if xs else 0.0


def _want(
    now: float, conc: float, target: float, ready: int, current: int, st: ReactiveState,
    rc: ReactiveConfig,
) -> tuple[int, ReactiveState, str]:  # fmt: skip
    """Rules 3 and 4 for one role: (replicas, new state, why)."""
    samples = (*(s for s in st.samples if now - s[0] < rc.stable_window_s), (now, conc))
    stable = _mean(samples, now - rc.stable_window_s)
    panic = _mean(samples, now - rc.panic_window_s)
    want_stable = math.ceil(stable / target - 1e-9)
    want_panic = math.ceil(panic / target - 1e-9)
    panic_until = st.panic_until
    if want_panic >= rc.panic_threshold * max(1, ready):
        panic_until = now + rc.stable_window_s
    panicking = now < panic_until
    want = max(want_panic, current) if panicking else want_stable
    base = max(1, ready)
    hi = math.ceil(rc.max_scale_up_rate * base)
    lo = math.floor(ready / rc.max_scale_down_rate)
    bounded = min(hi, max(lo, want))
    why = (
        f"{'panic' if panicking else 'stable'}: concurrency {stable:.2f} stable / {panic:.2f} "
        f"panic at {target:.2f} per replica -> {want}"
        + (f", rate-bounded to {bounded} (ready {ready})" if bounded != want else "")
    )
    return bounded, ReactiveState(samples, panic_until), why


def reactive_tick(now: float, inputs: PlannerInputs, cfg: PlannerConfig) -> Decision:
    """Decide every role's target under the reactive policy (see the module docstring)."""
    spec, w = inputs.spec, inputs.window
    desired = {r.name: clamp_role(r, inputs.desired.get(r.name, r.replicas)) for r in spec.roles}
    if w is None:
        why = inputs.telemetry_error or "no window"
        held = [f"telemetry unavailable ({why}): holding current targets"]
        return finish(now, inputs, desired, held, "telemetry-outage", cfg, inputs.state, {})
    targets: dict[str, int] = {}
    reasons: list[str] = []
    bindings: list[str] = []
    states = dict(inputs.state.reactive)
    for role in spec.roles:
        perf, source = perf_for(inputs, role.role)
        target = per_replica(role.role, perf, w, spec, cfg) if role.role != "kvcache" else 0.0
        if target <= 0:
            targets[role.name] = desired[role.name]
            why = "not planned" if role.role == "kvcache" else "no perf model, no target"
            reasons.append(f"{role.name}: holding {desired[role.name]} ({why})")
            continue
        share = len(spec.roles_of(role.role))
        ready_views = [i for i in active(inputs.instances, role.name) if i.state == "ready"]
        reported = float(sum(i.in_flight + i.queued for i in ready_views))
        conc = max(concurrency(role.role, w) / share, reported)
        ready = len(ready_views)
        n, states[role.name], why = _want(
            now, conc, target, ready, desired[role.name],
            states.get(role.name, ReactiveState()), cfg.reactive,
        )  # fmt: skip
        targets[role.name] = clamp_role(role, n)
        mode = "panic" if why.startswith("panic") else "stable"
        binding = f"{role.name}:reactive-{mode}"
        if targets[role.name] != n:
            binding = f"{role.name}:{'max' if n > role.max_replicas else 'min'}-replicas"
        bindings.append(binding)
        reasons.append(
            f"{role.name}: {desired[role.name]} -> {targets[role.name]} (reactive {why}) ({source})"
        )
    ratio_why = apply_ratio_bounds(spec, targets)
    if ratio_why:
        reasons.append(ratio_why)
        bindings.append("pd-ratio")
    state = replace(inputs.state, reactive=states)
    return finish(now, inputs, targets, reasons, ", ".join(bindings), cfg, state, {})
