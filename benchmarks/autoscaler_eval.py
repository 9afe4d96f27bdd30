"""Autoscaler evaluation in VIRTUAL TIME over the pure cores: prints one JSON object.

Replays the 14-day ServeGen tide (``servegen_language_m-large_rate.csv``, 10-minute rates),
time-compressed so that one day lasts ``--day-s`` virtual seconds and scaled by
``--rate-scale``, with request lengths drawn from Azure's 2023 conversation trace, against a
P/D fleet modelled in ``_autoscaler_sim.py`` (a request-level prefill queue and a decode
fixed point on ``services.common.perfmodel``; not the planner's own capacity formulas).
Policies:

* ``planner``: Tideserve's SLA planner core (``services.common.planner.on_tick``) fed
  with the fleet's windows, the profile as its performance model, the start-up time as lead;
* ``static``: a fixed fleet sized for the tide's peak on the fleet model itself (prefill at
  <= 85% utilisation at the peak rate, decode the fewest replicas meeting TPOT at the peak);
* ``kpa``: the product's reactive KPA-like policy (``services.common.planner.reactive``:
  concurrency per replica over a 60 s stable window, a 6 s panic window at 2x, no scale-down
  while panicking, bounded scale rates), fed like the planner.

Reports per policy: SLO attainment (share of ``--slo-window-s`` windows whose TTFT and TPOT
at the percentile meet the targets), replica-hours (virtual, and in trace hours), scaling
actions, instances started; the planner's online forecast error; and co-location: two
anti-phased tides (12 h apart) sharing one budget of ``--colocation-budget`` x the sum of
their separate peaks, under two readings of "separate peak" (each static fleet sized for its
peak; the most replicas each one's planner had when autoscaled alone). Lost requests and decision-to-serving time are NOT measured
here: no process runs; the live replay through the local stack is ``autoscaler_live.py``.

    .venv/bin/python benchmarks/autoscaler_eval.py --out /tmp/autoscaler_eval.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _autoscaler_sim import ROLES, Result, Sim, Tide, load_lengths, load_tide, score_window
from _harness import emit_json

from services.common.bench.plot import ensure_available, write_series_plot
from services.common.perfmodel import PerfProfile, get_profile
from services.common.planner import (
    Claim,
    PlannerConfig,
    PlannerInputs,
    PlannerState,
    ReactiveConfig,
    WindowView,
    allocate,
    decide,
    fit_roles,
    on_tick,
)
from services.common.planner.core import Decision
from services.common.planner.forecast import error, new_forecaster, observe
from services.common.planner.group import plan_group
from services.common.planner.ports import InstanceView
from services.common.planner.spec import DeploymentSpec, parse_spec

TRACES = Path("/work/shared/traces")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tide", type=Path, default=TRACES / "servegen_language_m-large_rate.csv")
    p.add_argument("--lengths", type=Path, default=TRACES / "azure2023_conv.csv")
    p.add_argument("--day-s", type=float, default=1200.0, help="virtual seconds per trace day")
    p.add_argument("--days", type=float, default=14.0, help="how many trace days to replay")
    p.add_argument("--rate-scale", type=float, default=0.25, help="multiplies the trace rate")
    p.add_argument("--profile", default="h200-llama3.1-8b", help="services.common.perfmodel")
    p.add_argument("--startup-s", type=float, default=10.0, help="decision to ready")
    p.add_argument("--ttft-ms", type=float, default=300.0)
    p.add_argument("--tpot-ms", type=float, default=25.0)
    p.add_argument("--percentile", type=int, default=90, choices=(50, 90, 99))
    p.add_argument("--tick-s", type=int, default=5, help="planner/autoscaler period")
    p.add_argument("--window-s", type=int, default=10, help="telemetry window per tick")
    p.add_argument("--slo-window-s", type=int, default=60, help="SLO attainment window")
    p.add_argument(
        "--predictor",
        default="holt_winters",
        choices=("constant", "moving_average", "holt_winters"),
    )
    p.add_argument("--max-replicas", type=int, default=32, help="per role")
    p.add_argument(
        "--max-utilization",
        type=float,
        default=PlannerConfig().max_utilization,
        help="planner: ceiling on prefill utilisation (headroom for bursts)",
    )
    p.add_argument("--policies", default="planner,static,kpa")
    p.add_argument(
        "--colocation-budget",
        type=float,
        default=0.75,
        help="shared budget as a share of the two separate static peaks (0 = skip)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="also draw each policy's ready replicas against the tide (needs matplotlib)",
    )
    return p.parse_args(argv)  # fmt: skip


def make_spec(
    args: argparse.Namespace, name: str, group: str = "", priority: int = 0
) -> DeploymentSpec:
    role = {"min_replicas": 1, "max_replicas": args.max_replicas, "replicas": 1}
    return parse_spec(
        {
            "name": name,
            "roles": [
                {"name": "prefill", "role": "prefill", **role},
                {"name": "decode", "role": "decode", **role},
            ],
            "slo_classes": [
                {"name": "default", "ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms,
                 "percentile": args.percentile}
            ],
            "budget": {"group": group, "priority": priority},
        }
    )  # fmt: skip


def planner_config(args: argparse.Namespace) -> PlannerConfig:
    """The defaults, with times compressed like the trace (a day = ``day_s``)."""
    return PlannerConfig(
        interval_s=args.tick_s,
        window_s=args.window_s,
        predictor=args.predictor,
        bucket_s=args.day_s / 48,  # 30 trace minutes
        season_s=args.day_s,
        scale_down_window_s=60.0,
        cooldown_s=30.0,
        startup_s_default=args.startup_s,
        max_utilization=args.max_utilization,
    )


class PlannerPolicy:
    def __init__(
        self,
        args: argparse.Namespace,
        spec: DeploymentSpec,
        perf: PerfProfile,
        initial: Mapping[str, int],
        cfg: PlannerConfig | None = None,
    ) -> None:
        self.args, self.spec, self.perf = args, spec, perf
        self.cfg = cfg or planner_config(args)
        self.state = PlannerState()
        self.desired = dict(initial)
        self.last: Decision | None = None

    def inputs(self, t: float, sim: Sim) -> PlannerInputs:
        w = sim.window(int(self.cfg.window_s))
        instances: list[InstanceView] = []
        ready_p = max(1, sim.fleet.ready("prefill", t))
        for role in ROLES:
            for k, at in enumerate(sorted(sim.fleet.ready_at[role])):
                state = "ready" if at <= t else "starting"
                queued = round(w.backlog / ready_p) if role == "prefill" and state == "ready" else 0
                instances.append(
                    InstanceView.of(f"{role}-{k}", self.spec.name, role, state, queued=queued)
                )
        return PlannerInputs(
            spec=self.spec,
            desired=self.desired,
            instances=tuple(instances),
            window=WindowView(w.requests, w.rate_rps, w.input_tokens, w.output_tokens,
                              ttft_ms=w.ttft_p, tpot_ms=w.tpot_p),
            perf={"prefill": self.perf, "decode": self.perf},
            startup_s={"prefill": self.args.startup_s, "decode": self.args.startup_s},
            state=self.state,
        )  # fmt: skip

    def accept(self, d: Decision) -> Mapping[str, int]:
        self.state, self.desired, self.last = d.state, dict(d.targets), d
        return d.targets

    def __call__(self, t: float, sim: Sim) -> Mapping[str, int]:
        return self.accept(decide(t, self.inputs(t, sim), self.cfg))


def static_targets(args: argparse.Namespace, sim: Sim) -> dict[str, int]:
    """Sized for the peak on the fleet model (see the module docstring)."""
    lengths = sim.lengths
    mean_in = sum(i for i, _ in lengths) / len(lengths)
    mean_out = sum(o for _, o in lengths) / len(lengths)
    peak = sim.tide.peak()
    s_mean = sum(sim.prefill_ms(i) for i, _ in lengths) / len(lengths)
    prefill = math.ceil(peak * s_mean / 1000.0 / 0.85)
    decode = 1
    while decode < args.max_replicas:
        tpot, fits = sim._tpot(peak, mean_in, mean_out, decode)
        if fits and tpot[args.percentile] <= args.tpot_ms:
            break
        decode += 1
    return {"prefill": min(prefill, args.max_replicas), "decode": decode}


def kpa_config(args: argparse.Namespace) -> PlannerConfig:
    """The product's reactive policy (``planner.policy: reactive``) with Knative's default
    windows (60 s stable, 6 s panic at 2x), sampled every tick from a one-tick window."""
    return planner_config(args).model_copy(
        update={"policy": "reactive", "window_s": float(args.tick_s),
                "reactive": ReactiveConfig(stable_window_s=60.0, panic_window_s=6.0)}
    )  # fmt: skip


def run(
    args: argparse.Namespace,
    sims: Sequence[Sim],
    decide: Any,
    initial: Sequence[Mapping[str, int]],
) -> list[Result]:
    """Advance ``sims`` together from ``initial`` fleets (warm: ready at t=0);
    ``decide(t) -> [targets per sim]`` every tick."""
    results = [Result() for _ in sims]
    for sim, targets in zip(sims, initial, strict=True):
        sim.fleet.set_targets(-args.startup_s, targets)
        sim.fleet.actions = sim.fleet.started = 0
    duration = int(min(s.tide.duration_s for s in sims) * args.days / 14.0)
    for t in range(duration):
        if t % args.tick_s == 0:
            for sim, targets in zip(sims, decide(float(t)), strict=True):
                sim.fleet.set_targets(float(t), targets)
        for sim, res in zip(sims, results, strict=True):
            sim.step(float(t))
            res.peak_replicas = max(
                res.peak_replicas, sum(len(v) for v in sim.fleet.ready_at.values())
            )
            if (t + 1) % args.slo_window_s == 0:
                score_window(
                    sim.window(args.slo_window_s), args.ttft_ms, args.tpot_ms, args.percentile, res
                )
        if t % args.tick_s == 0:
            for sim, res in zip(sims, results, strict=True):
                ready = {r: sim.fleet.ready(r, float(t)) for r in ROLES}
                res.timeline.append((float(t), sim.tide.rate(float(t)), ready))
        if len(sims) > 1 and t % args.tick_s == 0:
            for res in results:
                res.replica_series.append(0)
            results[0].replica_series[-1] = sum(
                sum(len(v) for v in s.fleet.ready_at.values()) for s in sims
            )
    return results


def summary(args: argparse.Namespace, sim: Sim, res: Result) -> dict[str, Any]:
    compress = 86_400.0 / args.day_s
    return {
        "slo_attainment": round(res.attainment, 4),
        "windows": res.windows,
        "ttft_missed_windows": res.ttft_missed,
        "tpot_missed_windows": res.tpot_missed,
        "replica_hours_virtual": round(sim.fleet.replica_s / 3600.0, 2),
        "replica_hours_trace": round(sim.fleet.replica_s * compress / 3600.0, 1),
        "scaling_actions": sim.fleet.actions,
        "instances_started": sim.fleet.started,
        "peak_replicas": res.peak_replicas,
    }


def new_sim(
    args: argparse.Namespace, tide: Tide, lengths: Any, perf: PerfProfile, seed: int
) -> Sim:
    return Sim(tide, lengths, perf, args.startup_s, seed)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    perf = get_profile(args.profile)
    rates = load_tide(args.tide)
    lengths = load_lengths(args.lengths)
    tide = Tide(rates, args.day_s, args.rate_scale)
    out: dict[str, Any] = {
        "benchmark": "autoscaler_eval",
        "mode": "virtual time over the pure cores (no processes; see benchmarks/README.md)",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "trace_rate_rps": {"mean": sum(rates) / len(rates), "min": min(rates), "max": max(rates)},
        "lengths_mean": {"input": sum(i for i, _ in lengths) / len(lengths),
                         "output": sum(o for _, o in lengths) / len(lengths)},
        "policies": {},
        "not_measured_here": ["lost_requests", "decision_to_serving_s"],
    }  # fmt: skip
    if args.plot:
        ensure_available()  # before the runs, not after them
    timelines: dict[str, Result] = {}
    static = static_targets(args, new_sim(args, tide, lengths, perf, args.seed))
    out["static_fleet"] = static
    for name in args.policies.split(","):
        sim = new_sim(args, tide, lengths, perf, args.seed)
        if name == "planner":
            policy: Any = PlannerPolicy(args, make_spec(args, "tide"), perf, static)
        elif name == "static":
            policy = lambda t, s, _x=static: _x  # noqa: E731
        elif name == "kpa":
            policy = PlannerPolicy(args, make_spec(args, "tide"), perf, static, kpa_config(args))
        else:
            raise SystemExit(f"unknown policy {name!r}")
        (res,) = run(args, [sim], lambda t, p=policy, s=sim: [p(t, s)], [static])
        out["policies"][name] = summary(args, sim, res)
        timelines[name] = res
        if name == "planner" and policy.last is not None and policy.state.forecaster is not None:
            e = error(policy.state.forecaster)
            out["forecast"] = {"predictor": args.predictor, "mape": round(e.mape, 4),
                               "mae_rps": round(e.mae, 2), "scored_buckets": e.scored}  # fmt: skip
    pol = out["policies"]
    if "static" in pol:
        base = pol["static"]["replica_hours_virtual"]
        for v in pol.values():
            v["replica_hours_vs_static"] = round(v["replica_hours_virtual"] / base, 3)
    out["forecast_by_predictor"] = forecast_errors(args, tide)
    if args.colocation_budget > 0:
        out["colocation"] = colocation(args, tide, lengths, perf, static)
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.plot:
        plot_replicas(args, timelines)
    emit_json(out, args.out)
    return 0


POLICY_LABELS = {"planner": "SLA planner", "static": "static (sized for the peak)",
                 "kpa": "reactive (KPA-like)"}  # fmt: skip


def plot_replicas(args: argparse.Namespace, runs: Mapping[str, Result]) -> None:
    """Ready replicas (prefill + decode) of each policy against the tide, per trace day."""
    if not runs:
        return
    first = next(iter(runs.values()))
    days = [t / args.day_s for t, _, _ in first.timeline]
    lines = {
        POLICY_LABELS.get(name, name): [float(sum(r.values())) for _, _, r in res.timeline]
        for name, res in runs.items()
    }
    write_series_plot(
        args.plot,
        days,
        lines,
        right={"request rate (req/s)": [rate for _, rate, _ in first.timeline]},
        xlabel=f"trace day ({args.day_s:g} virtual s each)",
        ylabel="ready replicas (prefill + decode)",
        right_label="request rate (req/s)",
        title=f"Replicas against the tide: {args.tide.name} x {args.rate_scale:g}, "
        f"SLO TTFT {args.ttft_ms:g} ms / TPOT {args.tpot_ms:g} ms at p{args.percentile}",
    )


def forecast_errors(args: argparse.Namespace, tide: Tide) -> dict[str, Any]:
    """Each predictor's online one-bucket-ahead error on the tide itself (rate per tick)."""
    out = {}
    for name in ("constant", "moving_average", "holt_winters"):
        cfg = planner_config(argparse.Namespace(**{**vars(args), "predictor": name}))
        f = new_forecaster(cfg)
        for t in range(0, int(tide.duration_s * args.days / 14.0), args.tick_s):
            f = observe(f, float(t), tide.rate(float(t)))
        e = error(f)
        out[name] = {
            "mape": round(e.mape, 4),
            "mae_rps": round(e.mae, 2),
            "scored_buckets": e.scored,
        }
    return out


def colocation(
    args: argparse.Namespace, tide: Tide, lengths: Any, perf: PerfProfile, static: Mapping[str, int]
) -> dict[str, Any]:
    """Two anti-phased tides (B = A shifted 12 h) on one shared budget, planner on both, at
    ``--colocation-budget`` x the sum of their separate peaks, under both readings of
    "separate peak": each static fleet (sized for its peak), and the most replicas each
    deployment's planner had at once when autoscaled alone."""
    tide_b = Tide(tide.rates, tide.day_s, tide.scale, shift_rows=72)
    static_b = static_targets(args, new_sim(args, tide_b, lengths, perf, args.seed))
    alone = []
    for name, t, st, seed in (("tide-a", tide, static, args.seed),
                              ("tide-b", tide_b, static_b, args.seed + 1)):  # fmt: skip
        sim = new_sim(args, t, lengths, perf, seed)
        policy = PlannerPolicy(args, make_spec(args, name), perf, st)
        (res,) = run(args, [sim], lambda _t, p=policy, s=sim: [p(_t, s)], [st])
        alone.append(summary(args, sim, res))
    bases = {
        "static_peaks": sum(static.values()) + sum(static_b.values()),
        "planner_alone_peaks": sum(a["peak_replicas"] for a in alone),
    }
    out: dict[str, Any] = {"planner_alone": dict(zip(("tide-a", "tide-b"), alone, strict=True))}
    for basis, separate in bases.items():
        budget = math.floor(args.colocation_budget * separate)
        out[basis] = {
            "separate_peaks": separate,
            **shared_budget(args, tide, tide_b, lengths, perf, (static, static_b), budget),
            "budget_vs_separate_peaks": round(budget / separate, 3),
        }
    return out


def shared_budget(
    args: argparse.Namespace, tide: Tide, tide_b: Tide, lengths: Any, perf: PerfProfile,
    wants: Sequence[Mapping[str, int]], budget: int,
) -> dict[str, Any]:  # fmt: skip
    """A (priority 10) and B (0) planned together on ``budget`` replicas."""
    sims = [
        new_sim(args, tide, lengths, perf, args.seed),
        new_sim(args, tide_b, lengths, perf, args.seed + 1),
    ]
    specs = [make_spec(args, "tide-a", "pool", 10), make_spec(args, "tide-b", "pool", 0)]
    allotted = allocate(  # warm start: each static fleet, fitted into the shared budget
        budget,
        [
            Claim(sp.name, sp.budget.priority, 2, sum(w.values()))
            for sp, w in zip(specs, wants, strict=True)
        ],
    )
    start = [fit_roles(sp, w, allotted[sp.name]) for sp, w in zip(specs, wants, strict=True)]
    policies = [PlannerPolicy(args, sp, perf, st) for sp, st in zip(specs, start, strict=True)]
    cfg = policies[0].cfg

    def decide_all(t: float) -> list[Mapping[str, int]]:
        inputs = {p.spec.name: p.inputs(t, s) for p, s in zip(policies, sims, strict=True)}
        alone = {n: on_tick(t, i, cfg) for n, i in inputs.items()}
        shared = plan_group(t, "pool", budget, inputs, alone, cfg)
        return [p.accept(shared[p.spec.name]) for p in policies]

    results = run(args, sims, decide_all, start)
    used = max(results[0].replica_series or [0])
    return {
        "budget": budget,
        "max_replicas_used_together": used,
        "deployments": {
            p.spec.name: {"priority": p.spec.budget.priority, **summary(args, s, r)}
            for p, s, r in zip(policies, sims, results, strict=True)
        },
    }


if __name__ == "__main__":
    sys.exit(main())
