"""``tideserve sim``: replay a trace through the control plane's cores in virtual time.

``--profile a,b,c`` runs each routing profile on a fresh fleet and writes their summaries
with a comparison (:mod:`services.sim.compare`), printing its table; ``--autoscale-policy
a,b,c`` does the same for autoscaling policies (:mod:`services.sim.policies`).

Exit codes: 0 the run finished (failed requests are counted in the JSON), 2 bad input (a
one-line error on stderr; nothing is written).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TextIO

import yaml

from services.common.bench.plot import PlotUnavailable, ensure_available
from services.common.bench.traces import FORMATS, Trace, TraceError, load_trace
from services.common.perfmodel import DEFAULT_PROFILE
from services.common.planner.spec import DeploymentSpec, SpecError, load_spec_file
from services.common.routing.config import ConfigError
from services.sim import SimConfig, SimConfigError, simulate
from services.sim.autoscale import AutoscaleConfig
from services.sim.compare import BASELINES, comparison_rows, profile_config, table
from services.sim.curve import RateCurve, curve_trace, read_curve
from services.sim.deployment import from_spec
from services.sim.policies import (
    parse_policies,
    policy_config,
    policy_row,
    policy_table,
    replica_seconds,
    slo_windows,
    with_ratios,
)
from services.sim.results import request_results
from services.sim.timeline import csv_text, plot_timeline

EXAMPLES = """\
examples:
  # 2,000 Mooncake requests on 8 aggregated engines, the shipped routing profile
  tideserve sim --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
      --max-requests 2000 --engines 8 --out sim.json --timeline sim.csv

  # P/D (3 prefill, 5 decode), twice the recorded rate, cache-aware routing, 2 gateways
  tideserve sim --trace ../shared/traces/weka_agentic_dev.jsonl --prefill 3 --decode 5 \\
      --rate-scale 2 --profile cache_aware --gateways 2 --seed 1 --out pd.json

  # routing profiles side by side (each on a fresh fleet), a table on stdout
  tideserve sim --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
      --max-requests 400 --rate-scale 2.5 --slo-ttft-ms 2000 --slo-tpot-ms 100 \\
      --profile default,cache_aware,round_robin,least_load --out compare.json

  # two days of the ServeGen tide, a day in 1,200 s, agentic requests, P/D autoscaled
  tideserve sim --rate-curve ../shared/traces/servegen_language_m-large_rate.csv \\
      --lengths ../shared/traces/weka_agentic_dev.jsonl --speedup 72 --rate-scale 0.01 \\
      --max-requests 20000 --prefill 2 --decode 6 --autoscale --out tide.json

  # the autoscaling policies side by side on one day of the tide (SLO windows, replica-s)
  tideserve sim --rate-curve ../shared/traces/servegen_language_m-large_rate.csv \\
      --lengths ../shared/traces/azure2023_conv.csv --curve-days 1 --speedup 72 \\
      --rate-scale 0.25 --prefill 8 --decode 3 --autoscale-policy sla,reactive,static \\
      --max-replicas 32 --startup-s 10 --slo-ttft-ms 300 --slo-tpot-ms 25 --seed 1 \\
      --out tide.json

  # start from one worker and let the SLA planner scale it (new instances serve after 30 s)
  tideserve sim --trace trace.jsonl --engines 1 --autoscale --max-replicas 12 \\
      --slo-ttft-ms 2000 --slo-tpot-ms 100 --out auto.json --timeline auto.csv

The JSON has the keys of `tideserve bench`'s summary (figures in modelled time) plus "sim"
(routing diagnostics, requests per instance) and "wall" (what the run cost).
"""


def _number(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}"
            ) from None

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    num, whole = _number(float), _number(int)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="Mooncake JSONL or Azure CSV trace file")
    src.add_argument("--rate-curve", metavar="FILE.csv",
                     help="arrivals from a rate curve (CSV t_s,rate_rps), the requests "
                     "from --lengths in order")  # fmt: skip
    p.add_argument("--lengths", metavar="TRACE",
                   help="with --rate-curve: the trace whose requests (lengths, prefix ids) "
                   "arrive")  # fmt: skip
    p.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: auto)")
    p.add_argument("--max-requests", type=whole, help="replay N requests (the trace repeats "
                   "with fresh prefix ids when shorter)")  # fmt: skip
    p.add_argument("--offset", type=whole, default=0, help="skip this many requests first")
    p.add_argument("--rate-scale", type=num, default=1.0, help="multiply the request rate")
    p.add_argument("--speedup", type=num, default=1.0,
                   help="time compression of the trace, as the bench's (arrivals / (speedup x "
                   "rate-scale)); of a rate curve, its clock alone (72: a day in 1,200 s, "
                   "rates unchanged); the engines run at modelled speed; the planner's forecast "
                   "bucket and season are divided by it")  # fmt: skip
    fleet = p.add_mutually_exclusive_group()
    fleet.add_argument("--engines", type=whole, help="aggregated engines (default 8)")
    fleet.add_argument("--prefill", type=whole, help="P/D: prefill instances (with --decode)")
    fleet.add_argument("--deployment", metavar="SPEC.yaml",
                       help="the fleet, profiles and SLO of a deployment spec (as `tideserve "
                       "apply -f` takes it; --profile and --engine-profile override its own)")  # fmt: skip
    p.add_argument("--decode", type=whole, help="P/D: decode instances (with --prefill)")
    p.add_argument("--profile",
                   help="routing profile (default: default); a comma list runs each on a fresh "
                   "fleet and compares them")  # fmt: skip
    p.add_argument("--baseline-profiles", default=",".join(BASELINES),
                   help="profiles standing in for another router, run without the gateway's "
                   f"dispatch order (default {','.join(BASELINES)}; '' for none)")  # fmt: skip
    p.add_argument("--profiles-file", help="routing profiles YAML (default: the shipped one)")
    p.add_argument("--engine-profile",
                   help=f"performance profile of the engines (default {DEFAULT_PROFILE})")  # fmt: skip
    p.add_argument("--gateway-perf-profile", default="",
                   help="performance profile the gateways price with (default: the engines', "
                   "an exact model; e.g. the engines at NAME*1.2 and the gateway at NAME)")  # fmt: skip
    p.add_argument("--gateways", type=whole, default=1, help="gateway replicas (default 1)")
    p.add_argument("--no-share-state", dest="share_state", action="store_false",
                   help="gateway replicas do not share routed prefixes and in-flight load "
                   "(default: they do, as `tideserve up` runs them, the other replicas' "
                   "picks arriving 5 ms later and their in-flight counts every 0.5 s)")  # fmt: skip
    p.add_argument("--seed", type=whole, default=0, help="seed of every random choice")
    p.add_argument("--slo-ttft-ms", type=num, help="TTFT SLO for goodput")
    p.add_argument("--slo-tpot-ms", type=num, help="TPOT SLO for goodput")
    p.add_argument("--load-source", choices=("scrape", "stream"), default="scrape",
                   help="the gateway's view of load: /metrics scrapes (default) or the "
                   "engines' load stream")  # fmt: skip
    p.add_argument(
        "--precise",
        action="store_true",
        help="give every pick each engine's resident prefix (a lag-free KV index)",
    )
    p.add_argument(
        "--decode-can-prefill",
        action="store_true",
        help="P/D: decode instances may compute a prompt alone (vLLM-like)",
    )
    p.add_argument(
        "--decode-keeps-kv",
        action="store_true",
        help="P/D: decode instances cache the KV they receive and take only the part of a "
        "prompt they do not hold (default: the whole prompt, nothing cached)",
    )
    p.add_argument("--short-first-tokens", type=whole, default=0,
                   help="engines prefill prompts with at most N tokens left to compute before "
                   "longer ones (default 0: FCFS)")  # fmt: skip
    p.add_argument("--kv-blocks", type=whole, default=16384, help="KV blocks per engine")
    p.add_argument("--max-batch", type=whole, default=256,
                   help="engines: max running sequences (default 256)")  # fmt: skip
    p.add_argument("--max-batched-tokens", type=whole, default=8192,
                   help="engines: tokens per step / prefill chunk (default 8192)")  # fmt: skip
    p.add_argument("--block-size", type=whole, default=64, help="engine and gateway block size")
    p.add_argument("--stream-interval", type=whole, default=16, help="engines' SSE coalescing")
    p.add_argument("--autoscale", action="store_true",
                   help="scale the roles with the autoscaler's SLA planner (targets: the SLOs, "
                   "default 2000 ms TTFT and 100 ms TPOT at p90)")  # fmt: skip
    p.add_argument("--autoscale-policy", metavar="LIST",
                   help="autoscaling policies side by side, each on a fresh fleet started at "
                   "the given size: a comma list of sla (the SLA planner), reactive (the "
                   "KPA-like policy), static (never scaled); prints a table")  # fmt: skip
    p.add_argument("--planner", action="append", default=[], metavar="NAME=VALUE",
                   help="autoscale: a planner setting (as the autoscaler's planner config, "
                   "e.g. predictor=constant, max_utilization=0.7); repeatable")  # fmt: skip
    p.add_argument("--slo-window-s", type=num, default=60.0,
                   help="--autoscale-policy: the SLO is judged per window of this many "
                   "modelled seconds (default 60)")  # fmt: skip
    p.add_argument("--curve-days", type=num,
                   help="with --rate-curve: replay only its first N days (its own time)")  # fmt: skip
    p.add_argument("--max-replicas", type=whole, default=16, help="autoscale: per role")
    p.add_argument("--startup-s", type=num, default=30.0,
                   help="autoscale: seconds from asking for an instance to it serving")  # fmt: skip
    p.add_argument("--agent-memory", choices=("lru", "retention", "prefetch"),
                   help="model agent sessions' KV (sessions = a trace's first hash id): lru "
                   "(today's), retention (protect idle sessions, offload the rest to a tier), "
                   "prefetch (retention + prefetch before the predicted return)")  # fmt: skip
    p.add_argument("--memory-budget-share", type=num, default=0.2,
                   help="agent memory: share of an engine's KV idle sessions may hold")  # fmt: skip
    p.add_argument("--memory-offload", choices=("pressure", "eager"), default="pressure",
                   help="agent memory: idle sessions past the budget stay on the GPU while it "
                   "has room (pressure) or are offloaded at once (eager)")  # fmt: skip
    p.add_argument("--memory-rebalance", action="store_true",
                   help="agent memory (retention, prefetch): move idle sessions off an "
                   "instance holding most of the active sessions' KV (hot spot)")  # fmt: skip
    p.add_argument("--memory-tier-mib", type=whole, default=None,
                   help="agent memory: the KV-cache tier's size in MiB (a kvcache role's "
                   "--kvcache-mib, DRAM plus disk; default: a deployment's kvcache roles, "
                   "else unbounded)")  # fmt: skip
    p.add_argument("--scale-in-at-s", type=num, default=None,
                   help="remove engines at this modelled second (the autoscaler's victim rule, "
                   "drain, then with agent memory migrate their sessions)")  # fmt: skip
    p.add_argument(
        "--scale-in-count", type=whole, default=1, help="engines --scale-in-at-s removes"
    )
    p.add_argument("--fail-at-s", type=num, default=None,
                   help="engines die at this modelled second (no drain; their KV lost): a "
                   "request not yet streaming is retried elsewhere, as the gateway does")  # fmt: skip
    p.add_argument("--fail-count", type=whole, default=1, help="engines --fail-at-s kills")
    p.add_argument("--fail-role", choices=("prefill", "decode"), default=None,
                   help="P/D: the role --fail-at-s kills engines of (default: any)")  # fmt: skip
    p.add_argument("--fail-detect-s", type=num, default=5.0,
                   help="seconds until the gateways' membership drops a dead engine")  # fmt: skip
    p.add_argument("--out", required=True, metavar="FILE.json", help="write the summary here")
    p.add_argument("--timeline", metavar="FILE.csv", help="per-minute timeline CSV")
    p.add_argument("--plot", metavar="FILE.png",
                   help="replicas per role against the request rate, per minute (matplotlib)")  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``sim`` subcommand to a ``tideserve`` argparse subparsers object."""
    p = subparsers.add_parser(
        "sim",
        help="replay a trace through the control plane in virtual time",
        description="Replay a trace through the scheduler's routing over simulated engines "
        "in virtual time; report the bench's figures.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    _one_line_errors(p)
    p.set_defaults(func=run)


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    def error(message: str) -> NoReturn:
        fail(message)

    p.error = error  # type: ignore[method-assign]


def fail(message: str) -> NoReturn:
    print(f"tideserve sim: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def config(args: argparse.Namespace) -> SimConfig:
    """The run's config from parsed options; raises ``SimConfigError``."""
    if bool(args.rate_curve) != bool(args.lengths):
        raise SimConfigError(
            "--lengths goes with --rate-curve" if args.lengths else "--rate-curve needs --lengths"
        )
    if args.deployment and args.decode is not None:
        raise SimConfigError("--decode goes with --prefill, not with --deployment")
    if not args.deployment and (args.prefill is None) != (args.decode is None):
        raise SimConfigError("P/D needs both --prefill N and --decode M")
    if args.prefill is not None and min(args.prefill, args.decode) < 1:
        raise SimConfigError("P/D needs --prefill N and --decode M, both at least 1")
    cfg = SimConfig(
        engines=8 if args.engines is None else args.engines,
        prefill=args.prefill or 0,
        decode=args.decode or 0,
        profile=(args.profile or "default").split(",")[0].strip(),
        profiles_file=args.profiles_file,
        engine_profile=args.engine_profile or DEFAULT_PROFILE,
        gateway_perf_profile=args.gateway_perf_profile,
        gateways=args.gateways,
        share_state=args.share_state,
        seed=args.seed,
        rate_scale=args.rate_scale,
        speedup=args.speedup,
        max_requests=args.max_requests,
        offset=args.offset,
        kv_blocks=args.kv_blocks,
        max_batch=args.max_batch,
        max_batched_tokens=args.max_batched_tokens,
        block_size=args.block_size,
        stream_interval=args.stream_interval,
        load_source=args.load_source,
        precise=args.precise,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        decode_can_prefill=args.decode_can_prefill,
        decode_keeps_kv=args.decode_keeps_kv,
        short_first_tokens=args.short_first_tokens,
        agent_memory=args.agent_memory,
        memory_budget_share=args.memory_budget_share,
        memory_offload=args.memory_offload,
        memory_rebalance=args.memory_rebalance,
        memory_tier_mib=args.memory_tier_mib,
        scale_in_at_s=args.scale_in_at_s,
        scale_in_count=args.scale_in_count,
        fail_at_s=args.fail_at_s,
        fail_count=args.fail_count,
        fail_role=args.fail_role,
        fail_detect_s=args.fail_detect_s,
        autoscale=AutoscaleConfig(
            max_replicas=args.max_replicas,
            startup_s=args.startup_s,
            ttft_ms=args.slo_ttft_ms or 2000.0,
            tpot_ms=args.slo_tpot_ms or 100.0,
            planner=planner_settings(args.planner),
            load_speedup=args.speedup,
        )
        if autoscaled(args)
        else None,
    )
    if args.deployment:
        cfg = from_spec(read_spec(args.deployment), cfg, autoscale=autoscaled(args))
        if args.profile:
            cfg = replace(cfg, profile=(args.profile).split(",")[0].strip())
        if args.engine_profile:
            cfg = replace(cfg, engine_profile=args.engine_profile)
    return cfg.validate()


def autoscaled(args: argparse.Namespace) -> bool:
    return bool(args.autoscale or args.autoscale_policy)


def planner_settings(items: list[str]) -> tuple[tuple[str, Any], ...]:
    """``--planner NAME=VALUE`` options as settings (values as YAML scalars: numbers,
    words); raises ``SimConfigError`` for a malformed one (PlannerConfig judges the rest)."""
    out: dict[str, Any] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise SimConfigError(f"--planner takes NAME=VALUE, got {item!r}")
        out[name.strip()] = yaml.safe_load(value) if value.strip() else ""
    return tuple(sorted(out.items()))


def read_spec(path: str) -> DeploymentSpec:
    """The deployment spec in ``path``; raises ``SimConfigError`` with its first problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SimConfigError(f"cannot read deployment {path!r}: {exc.strerror or exc}") from None
    try:
        return load_spec_file(text)
    except SpecError as exc:
        raise SimConfigError(f"deployment {path}: {str(exc).splitlines()[0]}") from None


def workload(args: argparse.Namespace, cfg: SimConfig) -> tuple[SimConfig, Trace, RateCurve | None]:
    """The trace to replay, or the one a rate curve makes (then with the config its
    arrivals need: already in modelled time, none skipped or cut); raises ``TraceError``
    or ``SimConfigError``."""
    trace = load_trace(args.lengths or args.trace, args.format)
    if args.offset >= len(trace.requests):
        raise SimConfigError(
            f"--offset {args.offset} skips the whole trace ({len(trace.requests)} requests)"
        )
    if not args.rate_curve:
        return cfg, trace, None
    curve = read_curve(args.rate_curve)
    if args.curve_days is not None:
        if not args.curve_days > 0:
            raise SimConfigError(f"--curve-days must be > 0, got {args.curve_days}")
        curve = curve.head(args.curve_days * 86_400.0)
    trace = curve_trace(curve, trace, rate_scale=cfg.rate_scale, speedup=cfg.speedup,
                        seed=cfg.seed, max_requests=cfg.max_requests,
                        offset=cfg.offset)  # fmt: skip
    return replace(cfg, rate_scale=1.0, speedup=1.0, offset=0, max_requests=None), trace, curve


def _curve_section(args: argparse.Namespace, curve: RateCurve) -> dict[str, Any]:
    """What a rate-curve run replayed (its config shows rate scale and speedup 1: the
    curve's arrivals are already in modelled time)."""
    return {"path": curve.path, "lengths": args.lengths, "rows": len(curve.t_s),
            "span_s": curve.span_s, "rate_scale": args.rate_scale, "speedup": args.speedup,
            "offset": args.offset, "max_requests": args.max_requests}  # fmt: skip


def _per_profile(path: str, name: str, profiles: int) -> Path:
    out = Path(path)
    return out.with_name(f"{out.stem}-{name}{out.suffix}") if profiles > 1 else out


def _progress(stream: TextIO) -> Any:
    def show(done: int, total: int, model_s: float) -> None:
        stream.write(f"\rtideserve sim: {done}/{total} requests, {model_s:.0f} s modelled")
        stream.flush()

    return show


def run(args: argparse.Namespace) -> int:
    """Execute ``tideserve sim`` with parsed arguments; returns the exit code."""
    if args.autoscale_policy:
        return run_policies(args)
    try:
        cfg, trace, curve = workload(args, config(args))
        if args.plot:
            ensure_available()
        for path in (args.out, args.timeline, args.plot):
            if path and not Path(path).parent.is_dir():
                raise SimConfigError(f"no such directory for {path!r}")
        profiles = [x.strip() for x in (args.profile or cfg.profile).split(",") if x.strip()]
        if not profiles:
            raise SimConfigError("--profile names no profile")
        baselines = [x.strip() for x in args.baseline_profiles.split(",") if x.strip()]
        tty = sys.stderr.isatty()
        docs: dict[str, dict[str, Any]] = {}
        timelines: dict[str, list[dict[str, Any]]] = {}
        for name in profiles:
            one = profile_config(cfg, name, baselines).validate()
            doc, sim_run = simulate(one, trace, _progress(sys.stderr) if tty else None)
            if tty:
                sys.stderr.write("\n")
            if curve is not None:
                doc["rate_curve"] = _curve_section(args, curve)
            docs[name], timelines[name] = doc, sim_run.timeline.rows
    except (SimConfigError, TraceError, ConfigError, PlotUnavailable) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    for name, rows in timelines.items():  # written once every run is done: bad input writes nothing
        if args.timeline:
            _per_profile(args.timeline, name, len(profiles)).write_text(
                csv_text(rows), encoding="utf-8"
            )
        if args.plot:
            plot_timeline(_per_profile(args.plot, name, len(profiles)), rows, title=name)
    if len(docs) == 1:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        return 0
    rows = comparison_rows(docs)
    out = {"comparison": rows, "baseline_profiles": baselines, "profiles": docs}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(table(rows))
    return 0


def run_policies(args: argparse.Namespace) -> int:
    """``--autoscale-policy a,b,c``: each policy on a fresh fleet; the table and JSON."""
    try:
        policies = parse_policies(args.autoscale_policy)
        if args.profile and "," in args.profile:
            raise SimConfigError("--autoscale-policy takes one --profile")
        if not (args.slo_window_s > 0):
            raise SimConfigError(f"--slo-window-s must be > 0, got {args.slo_window_s}")
        cfg, trace, curve = workload(args, config(args))
        assert cfg.autoscale is not None
        if args.plot:
            ensure_available()
        for path in (args.out, args.timeline, args.plot):
            if path and not Path(path).parent.is_dir():
                raise SimConfigError(f"no such directory for {path!r}")
        runs = [(p, policy_config(cfg, p, cfg.autoscale).validate()) for p in policies]
    except (SimConfigError, TraceError, ConfigError, PlotUnavailable) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    a = cfg.autoscale
    docs: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for name, one in runs:
        t0 = time.perf_counter()
        doc, sim_run = simulate(one, trace, _progress(sys.stderr) if sys.stderr.isatty() else None)
        if curve is not None:
            doc["rate_curve"] = _curve_section(args, curve)
        span_s = sim_run.arrivals[-1][0] / 1000.0 if sim_run.arrivals else 0.0
        windows = slo_windows(
            request_results(sim_run), window_s=args.slo_window_s, span_s=span_s,
            ttft_ms=a.ttft_ms, tpot_ms=a.tpot_ms, pct=a.percentile,
        )  # fmt: skip
        rs = replica_seconds(sim_run.timeline.rows, one.timeline_s)
        rows.append(policy_row(name, doc, windows, rs, one.instances))
        rows[-1]["wall_s"] = round(time.perf_counter() - t0, 1)
        docs[name] = doc
        if args.timeline:
            _per_profile(args.timeline, name, len(runs)).write_text(
                csv_text(sim_run.timeline.rows), encoding="utf-8"
            )
        if args.plot:
            plot_timeline(_per_profile(args.plot, name, len(runs)), sim_run.timeline.rows,
                          title=name)  # fmt: skip
    rows = with_ratios(rows)
    out = {
        "comparison": rows,
        "slo": {"ttft_ms": a.ttft_ms, "tpot_ms": a.tpot_ms, "percentile": a.percentile,
                "window_s": args.slo_window_s},
        "planner": dict(a.planner),
        "policies": docs,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(policy_table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m services.sim ...``)."""
    parser = argparse.ArgumentParser(
        prog="tideserve sim",
        description="Replay a trace through the control plane in virtual time.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    _one_line_errors(parser)
    return run(parser.parse_args(argv))
