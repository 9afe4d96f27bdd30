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
from services.common.bench.traces import Trace, TraceError, load_trace
from services.common.perfmodel import DEFAULT_PROFILE
from services.common.planner.spec import DeploymentSpec, SpecError, load_spec_file
from services.common.routing.config import ConfigError
from services.sim import SimConfig, SimConfigError, simulate
from services.sim.autoscale import AutoscaleConfig
from services.sim.cli_args import EXAMPLES, add_arguments
from services.sim.compare import comparison_rows, profile_config, table
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
