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

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _compare_targets import closed_loop_targets, prediction_error, targets
from _harness import (
    MOONCAKE_CONVERSATION,
    ROOT,
    CpuMeter,
    ProcGroup,
    command_line,
    free_port,
    has_verb,
    http_get,
    machine,
    read_records,
    sglang_router_python,
    tideserve,
    wait_http,
)
from _model_client import perf_model_of, start_model_server

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
    p.add_argument("--profile", default="h200-llama3.1-8b", help="engine perf profile")
    p.add_argument("--kv-blocks", type=int, default=16384, help="KV blocks per engine")
    p.add_argument("--stream-interval", type=int, default=16, help="engine tokens per chunk")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=100.0)
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--timeout", type=float, default=600.0, help="bench per-request timeout (s)")
    p.add_argument(
        "--gateway-slo-class", default="interactive",
        help="the SLO class Tideserve gateways file the bench's requests under (its TTFT "
        "target orders dispatch; interactive's 2 s is the default --slo-ttft-ms)",
    )  # fmt: skip
    p.add_argument(
        "--gateway-arg", action="append", default=[],
        help="extra flag for every `tideserve gateway` (repeatable, shell-split)",
    )  # fmt: skip
    p.add_argument(
        "--gateway-perf-profile", default="",
        help="the perf profile Tideserve gateways believe (default: the engines' --profile)",
    )  # fmt: skip
    p.add_argument(
        "--redis", action="store_true",
        help="an embedded Redis: engines publish load/KV events, gateways write records",
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
    p.add_argument("--log-dir", default=None, help="process logs and bench JSONs (default: temp)")
    return p.parse_args(argv)


# -- fleet ---------------------------------------------------------------------------------


def fleet_plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One dict per engine: role, url, port, bootstrap_port (prefill only)."""
    roles = (
        ["prefill"] * args.prefill + ["decode"] * args.decode
        if args.pd
        else ["aggregated"] * args.engines
    )
    plan = []
    for role in roles:
        port = free_port()
        plan.append({
            "role": role, "port": port, "url": f"http://127.0.0.1:{port}",
            "bootstrap_port": free_port() if role == "prefill" else 0,
        })  # fmt: skip
    return plan


def start_fleet(
    group: ProcGroup,
    args: argparse.Namespace,
    plan: list[dict[str, Any]],
    tag: str,
    streams: list[str] | None = None,
) -> None:
    """``streams``: ``--redis-url``/``--stream-prefix`` flags for every engine (or none)."""
    for i, e in enumerate(plan):
        cmd = tideserve(
            "engine", "--role", e["role"], "--port", str(e["port"]),
            "--instance-id", f"{tag}-{e['role']}-{i}", "--profile", args.profile,
            "--kv-blocks", str(args.kv_blocks), "--speedup", str(args.speedup),
            "--stream-interval", str(args.stream_interval),
            "--catch-up-ms", str(args.engine_catch_up_ms),
            "--state-dir", str(group.log_dir / f"engine-{i}"), "--log-level", "WARNING",
            *(streams or []),
        )  # fmt: skip
        if e["bootstrap_port"]:
            cmd += ["--bootstrap-port", str(e["bootstrap_port"])]
        if args.step_traces:
            cmd += ["--step-trace", str(group.log_dir / f"{tag}-engine-{i}.steps.jsonl")]
        env = {"TIDESERVE_ENGINE_BOOTSTRAP_TIMEOUT_S": str(args.bootstrap_timeout_s)}
        group.start(f"{tag}-engine-{i}", cmd, env=env)
    for e in plan:
        wait_http(e["url"] + "/health", group, 90.0)


def engine_requests(plan: list[dict[str, Any]]) -> list[float]:
    """``sglang:num_requests_total`` of each engine (how the router spread the load)."""
    out = []
    for e in plan:
        status, body = http_get(e["url"] + "/metrics", 5.0)
        value = float("nan")
        for line in body.decode(errors="replace").splitlines() if status == 200 else []:
            if line.startswith("sglang:num_requests_total{"):
                value = float(line.rsplit(" ", 1)[1])
        out.append(value)
    return out


# -- routers -------------------------------------------------------------------------------


def router_cmd(
    name: str, port: int, plan: list[dict[str, Any]], args: argparse.Namespace, py: Path | None
) -> list[str]:
    kind, _, policy = name.partition(":")
    urls = [e["url"] for e in plan]
    if kind == "tideserve":
        cmd = tideserve("gateway", "--host", "127.0.0.1", "--port", str(port))
        if args.pd:
            for e in plan:
                if e["role"] == "prefill":
                    cmd += ["--prefill", e["url"], str(e["bootstrap_port"])]
                else:
                    cmd += ["--decode", e["url"]]
            cmd += [
                "--decode-can-prefill" if args.decode_can_prefill else "--no-decode-can-prefill"
            ]
        else:
            cmd += ["--endpoints", *urls]
        if policy and policy != "default":
            cmd += ["--profile", policy]
        cmd += ["--default-slo-class", args.gateway_slo_class]
        for extra in args.gateway_arg:
            cmd += shlex.split(extra)
        return cmd
    if kind == "sglang":
        assert py is not None
        cmd = [str(py), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warn",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
        if args.pd:
            cmd += ["--pd-disaggregation"]
            for e in plan:
                if e["role"] == "prefill":
                    cmd += ["--prefill", e["url"], str(e["bootstrap_port"])]
                else:
                    cmd += ["--decode", e["url"]]
        else:
            cmd += ["--worker-urls", *urls]
        return [*cmd, "--policy", policy or "cache_aware"]
    raise ValueError(f"unknown router {name!r} (want tideserve:<profile> or sglang:<policy>)")


def wait_router(name: str, url: str, n: int, group: ProcGroup) -> None:
    """Ready = answers /v1/models, and (sglang) lists every worker healthy."""
    wait_http(url + "/v1/models", group, 90.0)
    if name.startswith("sglang:"):
        deadline = time.monotonic() + 90.0
        while time.monotonic() < deadline:
            group.check()
            _, body = http_get(url + "/workers")
            try:
                workers = json.loads(body or b"{}").get("workers", [])
            except ValueError:
                workers = []
            if len([w for w in workers if w.get("is_healthy")]) >= n:
                return
            time.sleep(0.3)
        raise RuntimeError(f"{name}: fewer than {n} healthy workers after 90s")
    time.sleep(2.0)  # one health/load scrape round of the gateway


def run_router(
    name: str,
    args: argparse.Namespace,
    log_dir: Path,
    py: Path | None,
    variant: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One router on a fresh fleet. ``variant`` (Tideserve only): ``label``,
    ``perf_profile`` the gateway believes, ``fit`` (telemetry's fitted model on), and
    ``redis_url`` + ``prefix`` (streams of this run)."""
    v = variant or {}
    label = v.get("label", name)
    tag = label.replace(":", "-").replace("+", "-")
    group = ProcGroup(log_dir)
    plan = fleet_plan(args)
    result: dict[str, Any] = {"router": label}
    streams: list[str] = []
    if v.get("redis_url"):
        streams = ["--redis-url", v["redis_url"], "--stream-prefix", v["prefix"]]
    try:
        start_fleet(group, args, plan, tag, streams)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = router_cmd(name, port, plan, args, py)
        if name.startswith("tideserve:"):
            cmd += streams
            if v.get("perf_profile"):
                cmd += ["--perf-profile", v["perf_profile"]]
            if v.get("fit"):
                cmd += ["--telemetry-address", start_model_server(group, v, tag),
                        "--perf-model-refresh", str(args.fit_refresh_s),
                        "--perf-model-min-confidence", str(args.fit_min_confidence)]  # fmt: skip
        result["router_command"] = shlex.join(cmd)
        router = group.start(f"{tag}-router", cmd)
        wait_router(name, url, len(plan), group)
        out = log_dir / f"{tag}-bench.json"
        bench = tideserve(
            "bench", "--trace", args.trace, "--target", url, "--api", args.api,
            "--max-requests", str(args.max_requests), "--speedup", str(args.speedup),
            "--rate-scale", str(args.rate_scale), "--trace-time",
            "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
            "--timeout", str(args.timeout), "--out", str(out),
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    routers = [r.strip() for r in (args.routers or (PD_ROUTERS if args.pd else AGG_ROUTERS))
               .split(",") if r.strip()]  # fmt: skip
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tideserve-routing-compare-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    py: Path | None = None
    sglang_reason = ""
    if any(r.startswith("sglang:") for r in routers):
        py, sglang_reason = sglang_router_python()
    gateway_ok = has_verb("gateway") if any(r.startswith("tideserve:") for r in routers) else True
    results: list[dict[str, Any]] = []
    env = machine()
    redis_server = None
    variants: list[dict[str, Any] | None] = [None] * len(routers)
    if args.closed_loop or args.redis:
        from services.common.embedded import start_redis

        redis_server = start_redis(log_dir / "redis", 0)
    if args.closed_loop:
        wrong = args.gateway_perf_profile or args.profile
        routers = ["tideserve:default"] * 3
        variants = [
            {"label": "true-profile", "perf_profile": args.profile},
            {"label": "wrong-profile", "perf_profile": wrong},
            {"label": "wrong-profile+fit", "perf_profile": wrong, "fit": True},
        ]
    elif args.gateway_perf_profile:
        variants = [{"perf_profile": args.gateway_perf_profile} for _ in routers]
    for i, v in enumerate(variants):
        if redis_server is not None:
            variants[i] = {**(v or {}), "redis_url": redis_server.url, "prefix": f"rc{i}"}
    try:
        for name, variant in zip(routers, variants, strict=True):
            if name.startswith("sglang:") and py is None:
                results.append({"router": name, "error": sglang_reason})
            elif name.startswith("tideserve:") and not gateway_ok:
                results.append({"router": name, "error": "`tideserve gateway` is not available"})
            else:
                results.append(run_router(name, args, log_dir, py, variant))
            print(f"[{results[-1]['router']}] done: "
                  f"{json.dumps(results[-1].get('ttft_ms', results[-1].get('error')))}",
                  file=sys.stderr)  # fmt: skip
    finally:
        if redis_server is not None:
            redis_server.stop()
    summary = {
        "benchmark": "routing_compare",
        "mode": "pd" if args.pd else "aggregated",
        "command": command_line(),
        "fleet": {
            "roles": (
                {"prefill": args.prefill, "decode": args.decode}
                if args.pd
                else {"aggregated": args.engines}
            ),
            "profile": args.profile,
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
        "machine": env,
        "sglang_router": sglang_reason or "0.3.2 (throwaway venv)",
        "gateway_perf_profile": args.gateway_perf_profile or args.profile,
        "results": results,
        "targets": closed_loop_targets(results) if args.closed_loop else targets(results),
        "log_dir": str(log_dir),
    }
    text = json.dumps(summary, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if any("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
