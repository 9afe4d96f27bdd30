"""``tideserve recommend``: the cheapest deployment that meets the SLOs, found in simulation
(shell over :mod:`services.sim.search`).

For every family (layout x routing profile x P:D share) the search bisects over the number
of instances, each candidate one ``tideserve sim`` run of the same trace, config and seed;
then it varies the engines' batch limits and KV blocks around the winner, and with
``--agent-memory`` the KV-cache tier's size (:func:`~services.sim.search.refine`: a setting
changes only where it saves an instance; then the smallest tier that still passes),
and runs the winner autoscaled under planner settings (:mod:`services.sim.planner_search`:
the spec's ``planner`` section, kept where it saves replica-seconds and meets the SLOs);
it prints what it tried and why each candidate lost, writes the JSON (``--out``) and the
recommended deployment spec (``--spec-out``, for ``tideserve apply -f``). Exit code 0 with a
recommendation, 1 when no candidate up to ``--max-instances`` meets the SLOs, 2 for bad
input.

Not to be confused with ``tideserve plan``, which asks a running autoscaler what it would do
now for a deployment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import yaml

from services.common.bench.traces import FORMATS, Trace, TraceError, load_trace
from services.common.perfmodel import DEFAULT_PROFILE
from services.common.routing.config import ConfigError
from services.sim import SimConfig, SimConfigError, simulate
from services.sim.planner_search import PlannerOutcome, parse_axes, planner_rows, runner, tune
from services.sim.policies import replica_seconds
from services.sim.recommend_table import planner_table, row, table
from services.sim.search import (
    SETTINGS,
    TIER,
    Candidate,
    Family,
    Layout,
    Outcome,
    Slo,
    families,
    judge,
    recommend,
    refine,
    smallest_passing,
    smallest_tier,
    spec_of,
)

__all__ = ["register", "search"]

EXAMPLES = """\
examples:
  # the cheapest fleet for 2,000 requests of the conversation trace at twice its rate
  tideserve recommend --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
      --max-requests 2000 --rate-scale 2 --slo-ttft-ms 2000 --slo-tpot-ms 100 \\
      --out rec.json --spec-out deployment.yaml
  tideserve apply -f deployment.yaml

  # no refinement of the engine settings (batch limits, KV blocks) after the size search
  tideserve recommend --trace t.jsonl --slo-ttft-ms 1000 --slo-tpot-ms 50 \
      --try-max-batch '' --try-max-batched-tokens '' --try-kv-blocks ''

  # agent sessions with retention: also size the KV-cache tier (a kvcache role in the spec)
  tideserve recommend --trace agentic.jsonl --slo-ttft-ms 2000 --slo-tpot-ms 100 \
      --agent-memory retention --tier-mib 262144 --try-tier-mib 0,65536,1048576

  # aggregated only, two routing profiles, at most 12 instances
  tideserve recommend --trace t.jsonl --slo-ttft-ms 1000 --slo-tpot-ms 50 \\
      --layouts aggregated --profiles default,cache_aware --max-instances 12 --json
"""


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="Mooncake JSONL or Azure CSV trace file")
    p.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: auto)")
    p.add_argument("--max-requests", type=int, help="replay N requests of the trace")
    p.add_argument("--offset", type=int, default=0, help="skip this many requests first")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the request rate")
    p.add_argument("--speedup", type=float, default=1.0, help="time compression of the trace")
    p.add_argument("--slo-ttft-ms", type=float, required=True, help="TTFT target")
    p.add_argument("--slo-tpot-ms", type=float, required=True, help="TPOT target")
    p.add_argument("--percentile", type=int, default=90, choices=(50, 90, 99),
                   help="the share of requests the targets hold for (default 90)")  # fmt: skip
    p.add_argument("--min-attainment", type=float, default=0.0,
                   help="also require this share of requests to meet both targets")  # fmt: skip
    p.add_argument("--layouts", default="aggregated,pd",
                   help="comma list of aggregated, pd (default both)")  # fmt: skip
    p.add_argument("--profiles", default="default",
                   help="routing profiles to try, comma list (default: default)")  # fmt: skip
    p.add_argument("--prefill-shares", default="0.25,0.5",
                   help="P/D: prefill share of the instances to try (default 0.25,0.5)")  # fmt: skip
    p.add_argument("--min-instances", type=int, default=1, help="smallest fleet to try")
    p.add_argument("--max-instances", type=int, default=16, help="largest fleet to try")
    p.add_argument("--engine-profile", default=DEFAULT_PROFILE,
                   help=f"performance profile of the engines (default {DEFAULT_PROFILE})")  # fmt: skip
    p.add_argument("--kv-blocks", type=int, default=16384, help="KV blocks per engine")
    p.add_argument("--max-batch", type=int, default=256,
                   help="engines' max running sequences (default 256)")  # fmt: skip
    p.add_argument("--max-batched-tokens", type=int, default=8192,
                   help="engines' tokens per step / prefill chunk (default 8192)")  # fmt: skip
    p.add_argument("--try-max-batch", default="64,128,512",
                   help="refine: max running sequences to try around the winner "
                   "(default 64,128,512; '' for none)")  # fmt: skip
    p.add_argument("--try-max-batched-tokens", default="2048,4096,16384",
                   help="refine: tokens per step to try (default 2048,4096,16384)")  # fmt: skip
    p.add_argument("--try-kv-blocks", default="8192,32768",
                   help="refine: KV blocks per engine to try (default 8192,32768)")  # fmt: skip
    p.add_argument("--agent-memory", choices=("lru", "retention", "prefetch"),
                   help="model agent sessions' KV in every run, as tideserve sim does "
                   "(retention and prefetch offload to a KV-cache tier)")  # fmt: skip
    p.add_argument("--tier-mib", type=int, default=262144,
                   help="agent memory: the KV-cache tier's size in MiB (default 262144)")  # fmt: skip
    p.add_argument("--try-tier-mib", default="0,65536,1048576",
                   help="refine, with --agent-memory retention or prefetch: tier sizes to try "
                   "(MiB; 0 = no tier; default 0,65536,1048576)")  # fmt: skip
    p.add_argument("--try-policy", default="reactive",
                   help="planner step: policies to try besides sla (default reactive)")  # fmt: skip
    p.add_argument("--try-predictor", default="constant",
                   help="planner step: load predictors to try besides holt_winters "
                   "(default constant)")  # fmt: skip
    p.add_argument("--try-max-utilization", default="0.7,0.95",
                   help="planner step: prefill utilisation ceilings to try besides 0.85 "
                   "(default 0.7,0.95)")  # fmt: skip
    p.add_argument("--try-decode-headroom", default="",
                   help="planner step: decode headrooms to try besides 0.9 (default none)")  # fmt: skip
    p.add_argument("--startup-s", type=float, default=30.0,
                   help="planner step: seconds from asking for an instance to it serving")  # fmt: skip
    p.add_argument("--gateways", type=int, default=1, help="gateway replicas")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    p.add_argument("--name", default="recommended", help="the spec's deployment name")
    p.add_argument("--model", default="tideserve-sim", help="the spec's model name")
    p.add_argument("--out", metavar="FILE.json", help="write the search's JSON here")
    p.add_argument("--spec-out", metavar="FILE.yaml", help="write the recommended spec here")
    p.add_argument("--json", action="store_true", help="print the JSON instead of the table")


def register(subparsers: Any) -> None:
    """Add the ``recommend`` verb to a ``tideserve`` argparse subparsers object."""
    p = subparsers.add_parser(
        "recommend",
        help="find the cheapest deployment that meets SLOs for a trace, in simulation",
        description="Search deployments (aggregated or P/D, sizes, routing profiles; then "
        "the engines' batch limits and KV blocks, and the planner's settings) in "
        "tideserve sim for the cheapest one meeting the SLOs; write its spec for "
        "tideserve apply -f. (tideserve plan is something else: what a running "
        "autoscaler would do now.)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def fail(message: str) -> NoReturn:
    print(f"tideserve recommend: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _families(args: argparse.Namespace) -> list[Family]:
    layouts = _csv(args.layouts)
    bad = [x for x in layouts if x not in ("aggregated", "pd")]
    if bad or not layouts:
        raise SimConfigError(f"--layouts takes aggregated and pd, got {args.layouts!r}")
    try:
        shares = [float(x) for x in _csv(args.prefill_shares)]
    except ValueError:
        raise SimConfigError(f"--prefill-shares: not numbers: {args.prefill_shares!r}") from None
    if "pd" in layouts and (not shares or not all(0 < s < 1 for s in shares)):
        raise SimConfigError("--prefill-shares must be numbers between 0 and 1")
    ls: list[Layout] = ["aggregated" if x == "aggregated" else "pd" for x in layouts]
    return families(ls, _csv(args.profiles), shares)


def _tiered(args: argparse.Namespace) -> bool:
    """The runs model agent memory with a tier (retention or prefetch)."""
    return args.agent_memory in ("retention", "prefetch")


def _axes(args: argparse.Namespace) -> list[tuple[str, list[int]]]:
    """The refinement's settings and values, in :data:`SETTINGS` order, then the tier's
    with agent memory (empty lists left out); raises ``SimConfigError`` for a value that is
    not a whole number >= 1 (>= 0 for the tier)."""
    out = []
    for name in (*SETTINGS, TIER) if _tiered(args) else SETTINGS:
        text = getattr(args, f"try_{name}")
        try:
            values = [int(x) for x in _csv(text)]
        except ValueError:
            raise SimConfigError(
                f"--try-{name.replace('_', '-')}: not integers: {text!r}"
            ) from None
        if any(v < (0 if name == TIER else 1) for v in values):
            bound = 0 if name == TIER else 1
            raise SimConfigError(f"--try-{name.replace('_', '-')}: values must be >= {bound}")
        if values:
            out.append((name, values))
    return out


def _planner_axes(args: argparse.Namespace) -> list[tuple[str, list[Any]]]:
    return parse_axes({
        "policy": args.try_policy, "predictor": args.try_predictor,
        "max_utilization": args.try_max_utilization, "decode_headroom": args.try_decode_headroom,
    })  # fmt: skip


def _base(args: argparse.Namespace) -> SimConfig:
    if not 1 <= args.min_instances <= args.max_instances:
        raise SimConfigError("--min-instances must be at least 1 and at most --max-instances")
    return SimConfig(
        engine_profile=args.engine_profile,
        gateways=args.gateways,
        seed=args.seed,
        rate_scale=args.rate_scale,
        speedup=args.speedup,
        max_requests=args.max_requests,
        offset=args.offset,
        kv_blocks=args.kv_blocks,
        max_batch=args.max_batch,
        max_batched_tokens=args.max_batched_tokens,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        agent_memory=args.agent_memory,
        memory_tier_mib=args.tier_mib if _tiered(args) else None,
    ).validate()


def _config(base: SimConfig, c: Candidate) -> SimConfig:
    s = {**defaults(base), **dict(c.settings)}
    cfg = replace(base, profile=c.family.profile, max_batch=s["max_batch"],
                  max_batched_tokens=s["max_batched_tokens"], kv_blocks=s["kv_blocks"],
                  memory_tier_mib=s.get(TIER))  # fmt: skip
    if c.engines:
        return replace(cfg, engines=c.engines).validate()
    return replace(cfg, prefill=c.prefill, decode=c.decode).validate()


def defaults(base: SimConfig) -> dict[str, int]:
    """The base's value of every setting the refinement varies (the tier's with one)."""
    out = {name: int(getattr(base, name)) for name in SETTINGS}
    if base.memory_tier_mib is not None:
        out[TIER] = base.memory_tier_mib
    return out


def search(
    base: SimConfig,
    trace: Trace,
    fams: list[Family],
    slo: Slo,
    lo: int,
    hi: int,
    progress: Any = None,
    axes: list[tuple[str, list[int]]] | None = None,
) -> tuple[Outcome | None, list[Outcome]]:
    """Every family's smallest passing size, then the engine settings (and with agent
    memory the tier) refined around the cheapest (``axes``), then the smallest tier that
    still passes at its size: (the recommendation, every outcome)."""
    cache: dict[tuple[int, int, int, str, tuple[tuple[str, int], ...]], Outcome] = {}

    def run(c: Candidate) -> Outcome:
        key = (c.engines, c.prefill, c.decode, c.family.profile, c.settings)
        if key not in cache:  # P/D shares may round to the same split
            t0, cpu0 = time.perf_counter(), time.process_time()
            cfg = _config(base, c)
            doc, sim_run = simulate(cfg, trace)
            o = judge(c, doc, slo)
            o.extra.update(
                wall_s=round(time.perf_counter() - t0, 2),
                cpu_s=round(time.process_time() - cpu0, 2),
                goodput_rps=doc.get("goodput_rps"),
                cache_hit_ratio=doc.get("cache_hit_ratio"),
                replica_s=round(replica_seconds(sim_run.timeline.rows, cfg.timeline_s), 1),
            )
            cache[key] = o
            if progress is not None:
                progress(len(cache), o)
        return cache[key]

    seen: list[Outcome] = []
    for fam in fams:
        _, outcomes = smallest_passing(fam, lo, hi, run)
        seen += [o for o in outcomes if o not in seen]
    base_settings = defaults(base)
    tier_base = base_settings.get(TIER, 0)
    best, _ = recommend(seen, tier_base)
    if best is not None and axes:
        _, outcomes = refine(best, axes, base_settings, run)
        seen += [o for o in outcomes if o not in seen]
        best, _ = recommend(seen, tier_base)
    tiers = dict(axes or ()).get(TIER)
    if best is not None and tiers is not None:
        _, outcomes = smallest_tier(best, tiers, tier_base, run)
        seen += [o for o in outcomes if o not in seen]
        best, _ = recommend(seen, tier_base)
    return best, seen


def _document(
    args: argparse.Namespace,
    slo: Slo,
    fams: list[Family],
    seen: list[Outcome],
    base: SimConfig,
    tuned: tuple[PlannerOutcome, list[PlannerOutcome]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The search's JSON (its spec None when nothing passes) and the table's rows."""
    settings = defaults(base)
    best, ranked = recommend(seen, settings.get(TIER, 0))
    rows = [row(o, why, slo.percentile, settings) for o, why in ranked]
    spec = None
    if best is not None:
        engine_args = ("--profile", args.engine_profile)
        chosen = tuned[0] if tuned else None
        spec = spec_of(
            best.candidate,
            name=args.name,
            model=args.model,
            perf_profile=args.engine_profile,
            slo=slo,
            engine_args=engine_args,
            settings=settings,
            planner=dict(chosen.settings) if chosen and chosen.outcome.passes else None,
            keep_min=chosen is not None and not chosen.outcome.passes,
        )
    doc = {
        "recommendation": next((r for r in rows if r["passes"] and not r["why_not"]), None),
        # requests longer than the model's context: they fail on every candidate, not counted
        "beyond_context": max((int(o.extra.get("beyond_context", 0)) for o in seen), default=0),
        "spec": spec,
        "tried": rows,
        "runs": len(seen),
        "slo": {
            "ttft_ms": slo.ttft_ms,
            "tpot_ms": slo.tpot_ms,
            "percentile": slo.percentile,
            "min_attainment": slo.min_attainment,
        },
        "search": {
            "families": [f.label for f in fams],
            "min_instances": args.min_instances,
            "max_instances": args.max_instances,
            "base_settings": settings,
            "refine": dict(_axes(args)),
        },
        "trace": {
            "path": args.trace,
            "max_requests": args.max_requests,
            "offset": args.offset,
            "rate_scale": args.rate_scale,
            "speedup": args.speedup,
        },
    }
    if tuned is not None and best is not None:
        fixed = float(best.extra.get("replica_s") or 0.0)
        doc["planner"] = {
            "tried": planner_rows(tuned[0], tuned[1], fixed, slo.percentile),
            "chosen": dict(tuned[0].settings) if tuned[0].outcome.passes else None,
            "fixed_replica_s": fixed,
            "startup_s": args.startup_s,
            "runs": len(tuned[1]),
        }
    return doc, rows


def run(args: argparse.Namespace) -> int:
    """Execute ``tideserve recommend`` with parsed arguments; returns the exit code."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.percentile, args.min_attainment)
        fams, base, axes = _families(args), _base(args), _axes(args)
        planner_axes = _planner_axes(args)
        trace = load_trace(args.trace, args.format)
        for path in (args.out, args.spec_out):
            if path and not Path(path).parent.is_dir():
                raise SimConfigError(f"no such directory for {path!r}")
        tty = sys.stderr.isatty()

        def show(n: int, o: Outcome) -> None:
            sys.stderr.write(f"\rtideserve recommend: {n} runs, last {o.candidate.label:<30}")
            sys.stderr.flush()

        best, seen = search(
            base, trace, fams, slo, args.min_instances, args.max_instances,
            show if tty else None, axes,
        )  # fmt: skip
        if tty:
            sys.stderr.write("\n")
        search_s = time.perf_counter() - wall0
        tuned = None
        if best is not None and planner_axes:
            fleet = _config(base, best.candidate)
            tuned = tune(planner_axes, runner(fleet, best.candidate, trace, slo, args.startup_s))
    except (ValueError, TraceError, ConfigError) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    doc, rows = _document(args, slo, fams, seen, base, tuned)
    doc["wall"] = {
        "duration_s": round(time.perf_counter() - wall0, 2),
        "cpu_s": round(time.process_time() - cpu0, 2),
        "fleet_search_s": round(search_s, 2),
        "planner_s": round(time.perf_counter() - wall0 - search_s, 2),
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if doc["spec"] is not None and args.spec_out:
        Path(args.spec_out).write_text(yaml.safe_dump(doc["spec"], sort_keys=False), "utf-8")
    print(text if args.json else table(rows, slo.percentile))
    if not args.json and doc["beyond_context"]:
        print(
            f"({doc['beyond_context']} requests exceed the model's context: they fail on every "
            "candidate and are not counted against any)"
        )
    if not args.json and "planner" in doc:
        print("\n" + planner_table(doc["planner"]["tried"], slo.percentile))
    if best is None:
        print(
            f"tideserve recommend: no candidate up to {args.max_instances} instances meets "
            "the SLOs",
            file=sys.stderr,
        )
        return 1
    return 0
