"""Routers side by side on the same simulated fleet and the same trace slice (issue 5).

For each router in turn: start a FRESH fleet of simulated engines (``tideserve engine``, same
profile, KV size, speedup and stream interval, so every router starts with empty caches),
start the router on a free port in front of it, replay the trace with ``tideserve bench``
(``--trace-time``: latencies in modelled time), record the bench JSON plus the CPU used by
the engines and the router, stop everything. Then compute the ratios issue 5 targets.

Aggregated (8 engines; Tideserve gateway profiles vs sglang-router policies):

    .venv/bin/python benchmarks/routing_compare.py --engines 8 --max-requests 400 \\
        --speedup 1 --rate-scale 2.5 --out /tmp/routing_compare.json

P/D (3 prefill + 5 decode; Tideserve default vs sglang-router --pd-disaggregation):

    .venv/bin/python benchmarks/routing_compare.py --pd --prefill 3 --decode 5 \\
        --max-requests 400 --speedup 2 --rate-scale 1 --out /tmp/routing_compare_pd.json

(P/D: Tideserve gets ``--no-decode-can-prefill`` as SGLang decode servers need a prefill peer,
so every request is disaggregated, as with sglang-router; ``--decode-can-prefill`` lets its
P/D decider keep prompts on the simulated decode engines, which real SGLang ones cannot.)

(``--rate-scale`` compresses arrivals: ``--speedup 1 --rate-scale 2.5`` sends as many requests
per wall second as ``--speedup 2.5 --rate-scale 1`` while the modelled fleet is 2.5x busier.
Figures and why these settings: benchmarks/README.md.)

Closed loop (issue 10): engines run ``--profile`` while the gateway is told another
(``--gateway-perf-profile``); ``--closed-loop`` runs ``tideserve:default`` three times —
believing the true profile, the wrong one, and the wrong one with telemetry's fitted model
on (``--telemetry-address`` to a model process fed from the gateway's records; see
``benchmarks/_model_server.py``) — all on one embedded Redis (engines publish load
snapshots, the gateway records requests), each run on its own stream prefix:

    .venv/bin/python benchmarks/routing_compare.py --closed-loop --engines 4 \
        --profile 'h200-llama3.1-8b*2' --gateway-perf-profile h200-llama3.1-8b \
        --max-requests 400 --speedup 1 --rate-scale 1 --out /tmp/closed_loop.json

Rules (``_compare_rules.py``): by default the figures of record — the SLO reaches the
gateway only as its default class's targets in a ``--slo-config`` file written from
``--slo-ttft-ms``/``--slo-tpot-ms`` (the bench's SLO), the engines run ``--profile``
``--engine-slowdown`` (1.2) times slower and the gateway keeps its shipped perf profile;
``--old-rules`` reproduces the earlier favourable setup (``--default-slo-class interactive``
for our gateway alone, engines at ``--profile``). ``--runs N`` (default 2) runs every router
N times, interleaved (ours, theirs, ours, theirs), each on a fresh fleet; the summary has
per-router means and ranges (``per_router``) and the targets on the means.

Routers are ``tideserve:<profile>`` (``tideserve gateway --endpoints ...``) and
``sglang:<policy>`` (sglang-router 0.3.2 from PyPI, installed into a throwaway venv under the
temp dir on first use; never a project dependency). A router that cannot be started is
recorded with its error and the others still run. Every figure comes from the run; a run
whose machine was CPU-saturated carries ``cpu.saturated = true`` and is not a clean figure.
Exit code: 0, or 1 when no router produced a result.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _compare_fleet import (
    engine_requests,
    fleet_plan,
    start_fleet,
    starting,
    wait_barrier,
)
from _compare_router import start_router
from _compare_rules import (
    OLD_RULES_SLO_CLASS,
    engine_profile,
    gateway_perf_profile,
    mean_results,
    per_router,
    slo_config,
)
from _compare_targets import closed_loop_targets, prediction_error, targets
from _harness import (
    MOONCAKE_CONVERSATION,
    ROOT,
    CpuMeter,
    ProcGroup,
    command_line,
    has_verb,
    machine,
    read_records,
    sglang_router_python,
    tideserve,
    unwind_on_sigterm,
)
from _model_client import perf_model_of

AGG_ROUTERS = (
    "tideserve:default,tideserve:least_load,tideserve:round_robin,"
    "sglang:cache_aware,sglang:round_robin"
)
PD_ROUTERS = "tideserve:default,sglang:cache_aware,sglang:round_robin"
KEEP = (
    "completed", "failed", "duration_s", "wall_duration_s", "request_throughput_rps",
    "output_token_throughput", "ttft_ms", "tpot_ms", "e2e_ms", "goodput_rps",
    "slo_attainment", "cache_hit_ratio", "infinite_cache_hit_ratio", "errors",
    "output_length_mismatch", "not_sent",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=8, help="aggregated engines (default 8)")
    p.add_argument("--pd", action="store_true", help="P/D mode: --prefill + --decode engines")
    p.add_argument("--prefill", type=int, default=3, help="prefill engines in --pd mode")
    p.add_argument(
        "--bootstrap-timeout-s", type=float, default=300.0,
        help="P/D: how long a decode engine waits for its prefill peer before answering 502 "
        "(default 300 s: SGLang's own SGLANG_DISAGGREGATION_WAITING_TIMEOUT and "
        "_BOOTSTRAP_TIMEOUT defaults; the simulated engine's own default is 60 s)",
    )  # fmt: skip
    p.add_argument("--decode", type=int, default=5, help="decode engines in --pd mode")
    p.add_argument(
        "--decode-can-prefill", action="store_true",
        help="--pd: let Tideserve keep prompts on decode engines (vLLM-like; the simulated "
        "engines can, SGLang decode servers cannot; default: no, as with SGLang)",
    )  # fmt: skip
    p.add_argument(
        "--routers", default=None,
        help=f"comma list (default aggregated: {AGG_ROUTERS}; --pd: {PD_ROUTERS})",
    )  # fmt: skip
    p.add_argument("--trace", default=str(MOONCAKE_CONVERSATION), help="Mooncake JSONL trace")
    p.add_argument("--max-requests", type=int, default=400)
    p.add_argument("--speedup", type=float, default=2.0, help="engines and trace replay")
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument(
        "--profile", default="h200-llama3.1-8b",
        help="engine perf profile, before --engine-slowdown",
    )  # fmt: skip
    p.add_argument(
        "--engine-slowdown", type=float, default=1.2,
        help="engines run --profile this many times slower (NAME*FACTOR), a profile the "
        "gateway is not given (default 1.2; --old-rules: 1)",
    )  # fmt: skip
    p.add_argument(
        "--old-rules", action="store_true",
        help="the earlier favourable setup: our gateway alone gets --default-slo-class "
        "interactive, engines run --profile unslowed (its default perf profile's)",
    )  # fmt: skip
    p.add_argument(
        "--runs", type=int, default=2,
        help="runs per router, interleaved (ours, theirs, ours, theirs; default 2)",
    )  # fmt: skip
    p.add_argument("--kv-blocks", type=int, default=16384, help="KV blocks per engine")
    p.add_argument("--stream-interval", type=int, default=16, help="engine tokens per chunk")
    p.add_argument(
        "--slo-ttft-ms", type=float, default=2000.0,
        help="TTFT SLO: the bench's, and the gateway's default class's target (--slo-config)",
    )  # fmt: skip
    p.add_argument(
        "--slo-tpot-ms", type=float, default=100.0,
        help="TPOT SLO: the bench's, and the gateway's default class's target (--slo-config)",
    )  # fmt: skip
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--timeout", type=float, default=600.0, help="bench per-request timeout (s)")
    p.add_argument(
        "--gateway-arg", action="append", default=[],
        help="extra flag for every `tideserve gateway` (repeatable, shell-split)",
    )  # fmt: skip
    p.add_argument(
        "--gateway-perf-profile", default="",
        help="the perf profile Tideserve gateways believe (default: their shipped one)",
    )  # fmt: skip
    p.add_argument(
        "--redis", action="store_true",
        help="an embedded Redis: engines publish load/KV events, gateways write records",
    )  # fmt: skip
    p.add_argument(
        "--start-barrier", default=None, metavar="DIR:N",
        help="with others run at once (goodput_live --parallel): once this run's fleet and "
        "router are up, leave a file in DIR and start the bench when DIR holds N, so that no "
        "run's bench sees another's start-up (every start is done before any bench begins)",
    )  # fmt: skip
    p.add_argument(
        "--closed-loop", action="store_true",
        help="run tideserve:default believing the true profile, --gateway-perf-profile, and "
        "--gateway-perf-profile with the fitted model (implies --redis)",
    )  # fmt: skip
    p.add_argument(
        "--engine-catch-up-ms", type=float, default=200.0,
        help="engines keep their modelled step schedule up to this far behind "
        "(services.engine.pacing; 0 = every step at the wall clock)",
    )  # fmt: skip
    p.add_argument(
        "--step-traces", action="store_true",
        help="engines write step traces (<log-dir>/<router>-engine-<i>.steps.jsonl) for "
        "benchmarks/step_trace_summary.py",
    )  # fmt: skip
    p.add_argument("--fit-min-confidence", type=float, default=0.5)
    p.add_argument("--fit-refresh-s", type=float, default=2.0)
    p.add_argument("--out", default="routing_compare.json", help="summary JSON path")
    p.add_argument(
        "--log-dir", default=None,
        help="process logs, bench JSONs and per-request records (default: temp)",
    )  # fmt: skip
    p.set_defaults(slo_config_file=None)  # written by main: the gateway's --slo-config
    return p.parse_args(argv)


# -- routers -------------------------------------------------------------------------------


def run_router(
    name: str,
    args: argparse.Namespace,
    log_dir: Path,
    py: Path | None,
    variant: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One router on a fresh fleet. ``variant`` (Tideserve only): ``label``,
    ``perf_profile`` the gateway believes, ``fit`` (telemetry's fitted model on),
    ``redis_url`` + ``prefix`` (streams of this run), and ``run`` (its number)."""
    v = variant or {}
    label = v.get("label", name)
    run = int(v.get("run", 0))
    tag = label.replace(":", "-").replace("+", "-") + f"-r{run}"
    group = ProcGroup(log_dir)
    plan = fleet_plan(args)
    result: dict[str, Any] = {"router": label, "run": run}
    if name.startswith("tideserve:"):
        result["gateway_perf_profile"] = gateway_perf_profile(args, v)
    streams: list[str] = []
    if v.get("redis_url"):
        streams = ["--redis-url", v["redis_url"], "--stream-prefix", v["prefix"]]
    try:
        start_fleet(group, args, plan, tag, streams)
        with starting():  # the router's port, like the engines', bound before others pick
            router, url, cmd = start_router(name, args, plan, py, group, tag, v, streams)
        result["router_command"] = shlex.join(cmd)
        if args.start_barrier:
            wait_barrier(args.start_barrier, tag, group)
        out = log_dir / f"{tag}-bench.json"
        bench = tideserve(
            "bench", "--trace", args.trace, "--target", url, "--api", args.api,
            "--max-requests", str(args.max_requests), "--speedup", str(args.speedup),
            "--rate-scale", str(args.rate_scale), "--trace-time",
            "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
            "--timeout", str(args.timeout), "--out", str(out),
            "--requests-out", str(log_dir / f"{tag}-requests.jsonl"),
        )  # fmt: skip
        result["bench_command"] = shlex.join(bench)
        print(f"[{name}] {shlex.join(bench)}", file=sys.stderr)
        engines_cpu = CpuMeter([c.proc.pid for c in group.children if c is not router])
        router_cpu = CpuMeter([router.proc.pid])
        started = time.monotonic()
        with (log_dir / f"{tag}-bench.log").open("wb") as blog:
            code = subprocess.run(bench, cwd=ROOT, stdout=blog, stderr=subprocess.STDOUT).returncode
        result["bench_wall_s"] = round(time.monotonic() - started, 1)
        result["engines_cpu"] = engines_cpu.read()
        result["router_cpu"] = router_cpu.read()
        result["router_alive_after"] = router.proc.poll() is None
        if code == 2 or not out.exists():
            result["error"] = f"bench exited {code}; see {log_dir / (tag + '-bench.log')}"
            return result
        summary = json.loads(out.read_text(encoding="utf-8"))
        result.update({k: summary[k] for k in KEEP if k in summary})
        cpu = summary.get("cpu", {})
        result["cpu"] = {
            k: cpu.get(k)
            for k in ("saturated", "mean_total_percent", "max_total_percent",
                      "longest_busy_window_s", "bench_process_mean_percent")
        }  # fmt: skip
        result["requests_per_engine"] = engine_requests(plan)
        if v.get("fit"):
            result["fitted_model"] = perf_model_of(v["model_address"])
        if v.get("redis_url"):
            time.sleep(1.0)  # the gateway's record sink flushes
            recs, _ = read_records(v["redis_url"], f"{v['prefix']}:requests", "-")
            result["gateway_ttft_prediction_error"] = prediction_error(recs)
        result["roles"] = [e["role"] for e in plan]
        result["bench_json"] = str(out)
        return result
    except (RuntimeError, OSError, ValueError) as err:
        result["error"] = str(err)
        return result
    finally:
        group.stop()


def run_plan(
    args: argparse.Namespace, redis_url: str | None
) -> list[tuple[str, dict[str, Any] | None]]:
    """(router, variant) per run in order: every router once per run, runs interleaved."""
    routers = [r.strip() for r in (args.routers or (PD_ROUTERS if args.pd else AGG_ROUTERS))
               .split(",") if r.strip()]  # fmt: skip
    variants: list[dict[str, Any] | None] = [None] * len(routers)
    if args.closed_loop:
        wrong = args.gateway_perf_profile or args.profile
        routers = ["tideserve:default"] * 3
        variants = [
            {"label": "true-profile", "perf_profile": engine_profile(args)},
            {"label": "wrong-profile", "perf_profile": wrong},
            {"label": "wrong-profile+fit", "perf_profile": wrong, "fit": True},
        ]
    elif args.gateway_perf_profile:
        variants = [{"perf_profile": args.gateway_perf_profile} for _ in routers]
    plan: list[tuple[str, dict[str, Any] | None]] = []
    for run in range(args.runs):
        for i, (name, v) in enumerate(zip(routers, variants, strict=True)):
            w: dict[str, Any] = {**(v or {}), "run": run}
            if redis_url is not None:
                w.update(redis_url=redis_url, prefix=f"rc{run}-{i}")
            plan.append((name, w))
    return plan


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unwind_on_sigterm()  # a killed comparison stops its fleet and embedded Redis
    if args.runs < 1:
        print("--runs must be at least 1", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tideserve-routing-compare-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if not args.old_rules:
        args.slo_config_file = log_dir / "slo.yaml"
        args.slo_config_file.write_text(
            yaml.safe_dump(slo_config(args.slo_ttft_ms, args.slo_tpot_ms), sort_keys=False),
            encoding="utf-8",
        )
    env = machine()
    redis_server = None
    if args.closed_loop or args.redis:
        from services.common.embedded import start_redis

        redis_server = start_redis(log_dir / "redis", 0)
    plan = run_plan(args, redis_server.url if redis_server is not None else None)
    py: Path | None = None
    sglang_reason = ""
    if any(r.startswith("sglang:") for r, _ in plan):
        py, sglang_reason = sglang_router_python()
    gateway_ok = has_verb("gateway") if any(r.startswith("tideserve:") for r, _ in plan) else True
    results: list[dict[str, Any]] = []
    try:
        for name, variant in plan:
            run = (variant or {}).get("run", 0)
            if name.startswith("sglang:") and py is None:
                results.append({"router": name, "run": run, "error": sglang_reason})
            elif name.startswith("tideserve:") and not gateway_ok:
                results.append({"router": name, "run": run,
                                "error": "`tideserve gateway` is not available"})  # fmt: skip
            else:
                results.append(run_router(name, args, log_dir, py, variant))
            print(f"[{results[-1]['router']} run {run}] done: "
                  f"{json.dumps(results[-1].get('ttft_ms', results[-1].get('error')))}",
                  file=sys.stderr)  # fmt: skip
    finally:
        if redis_server is not None:
            redis_server.stop()
    summary = _summary(args, env, sglang_reason, results, log_dir)
    text = json.dumps(summary, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if any("error" not in r for r in results) else 1


def _summary(
    args: argparse.Namespace,
    env: dict[str, object],
    sglang_reason: str,
    results: list[dict[str, Any]],
    log_dir: Path,
) -> dict[str, Any]:
    means = mean_results(results)
    used = sorted({r["gateway_perf_profile"] for r in results if "gateway_perf_profile" in r})
    return {
        "benchmark": "routing_compare",
        "mode": "pd" if args.pd else "aggregated",
        "command": command_line(),
        "rules": "old (favourable)" if args.old_rules else "of record",
        "runs": args.runs,
        "fleet": {
            "roles": (
                {"prefill": args.prefill, "decode": args.decode}
                if args.pd
                else {"aggregated": args.engines}
            ),
            "profile": engine_profile(args),
            "kv_blocks": args.kv_blocks,
            "speedup": args.speedup,
            "stream_interval": args.stream_interval,
            "engine_catch_up_ms": args.engine_catch_up_ms,
            "fresh_fleet_per_router": True,
            "tideserve_decode_can_prefill": bool(args.pd and args.decode_can_prefill),
        },
        "workload": {
            "trace": args.trace,
            "max_requests": args.max_requests,
            "rate_scale": args.rate_scale,
            "api": args.api,
            "time_base": "trace",
            "slo_ttft_ms": args.slo_ttft_ms,
            "slo_tpot_ms": args.slo_tpot_ms,
        },
        "gateway_slo": (
            f"--default-slo-class {OLD_RULES_SLO_CLASS} (our gateway only)"
            if args.old_rules
            else slo_config(args.slo_ttft_ms, args.slo_tpot_ms)["scheduler"]
        ),
        "machine": env,
        "sglang_router": sglang_reason or "0.3.2 (throwaway venv)",
        "gateway_perf_profile": used[0] if len(used) == 1 else used,
        "results": results,
        "per_router": per_router(results),
        "targets": closed_loop_targets(means) if args.closed_loop else targets(means),
        "log_dir": str(log_dir),
    }


if __name__ == "__main__":
    sys.exit(main())
