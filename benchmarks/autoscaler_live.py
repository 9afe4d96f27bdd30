"""Live autoscaler evaluation: a time-compressed ServeGen tide replayed through the
local stack with simulated engines, real telemetry and the local driver; prints one JSON object.

What runs, all real, on this machine (``_live_stack.py``): embedded Postgres and Redis; the
telemetry service as ``main.build`` wires it (ingest of the gateway's request records,
``QueryWindow`` over 1-s buckets, the fitted performance model with start-up times from the
membership stream); the scheduler/gateway following ``{prefix}:membership``; the autoscaler
service (planner loop reading telemetry over gRPC, seam, reconciler, ``local`` driver
starting ``tideserve engine --profile test`` processes, drain through ``Drain``); and an
open-loop Poisson client whose rate follows one day of ``servegen_language_m-large_rate.csv``
compressed into ``--day-s`` seconds, scaled so the day's peak is ``--peak-rps``.

Policies (``--policy``), one per run, all through the same control path:

* ``planner``: the SLA planner (``planner.policy: sla``), min 1, starting at 1;
* ``reactive``: the KPA-like threshold autoscaler (``planner.policy: reactive``), same bounds;
* ``static``: the planner loop off, ``--static-replicas`` (default: sized for the peak by the
  planner's capacity model on the engines' profile, printed) from the start.

Reported: requests sent and lost (non-200, cut streams, errors); SLO attainment over
``--slo-window-s`` windows and over 60-s windows (TTFT and TPOT at the spec's percentile
against its targets; windows with no finished request skipped); replica-seconds (instances
starting, ready or draining, sampled about every second, each count held until the next) and trace-equivalent replica-hours;
scaling actions; decision -> serving (a scale-out decision's ts to each new instance's ADDED
event on the membership stream, which the gateway follows); the planner's forecast error.

    .venv/bin/python benchmarks/autoscaler_live.py --policy planner
    .venv/bin/python benchmarks/autoscaler_live.py --policy reactive
    .venv/bin/python benchmarks/autoscaler_live.py --policy static
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import grpc
import numpy as np
import redis.asyncio as aioredis
from _autoscaler_sim import Tide, load_tide
from _harness import command_line, emit_json, machine
from _live_stack import live_stack
from tideserve.v1 import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    common_pb2,
    events_pb2,
    telemetry_pb2,
    telemetry_pb2_grpc,
)

from services.autoscaler.translate import spec_to_proto
from services.common.embedded import start_postgres, start_redis
from services.common.perfmodel import get_profile
from services.common.planner import PlannerConfig, ReactiveConfig, WindowView
from services.common.planner.capacity import Demand, Targets, decode_need, prefill_need
from services.common.planner.reactive import per_replica
from services.common.planner.spec import DeploymentSpec, load_spec_file
from services.common.streams import decode_entry
from tests.helpers.engine_stack import stream_sse

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "servegen_language_m-large_rate.csv"
AGG = ROOT / "deploy" / "examples" / "aggregated.yaml"
ME = events_pb2.MembershipEvent
WORDS = [f"w{i}" for i in range(5000)]


@dataclass
class Req:
    sent: float
    prompt_tokens: int
    status: int = 0
    ok: bool = False
    first: float = 0.0
    end: float = 0.0
    chunks: int = 0

    @property
    def ttft_ms(self) -> float:
        return (self.first - self.sent) * 1000

    @property
    def tpot_ms(self) -> float:
        return (self.end - self.first) * 1000 / max(1, self.chunks - 1)


@dataclass
class Client:
    reqs: list[Req] = field(default_factory=list)


class _First:
    """Duck-typed ``StartCounter``: remembers when the first content chunk arrived."""

    def __init__(self, req: Req) -> None:
        self.req = req

    def hit(self) -> None:
        self.req.first = time.monotonic()


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else 0.0


async def _one(http: aiohttp.ClientSession, url: str, req: Req, max_tokens: int) -> None:
    words = random.choices(WORDS, k=req.prompt_tokens)
    body = {
        "model": "tideserve-sim",
        "messages": [{"role": "user", "content": " ".join(words)}],
        "max_tokens": max_tokens,
    }
    try:
        out = await stream_sse(http, url, body, started=_First(req))  # type: ignore[arg-type]
    except (aiohttp.ClientError, TimeoutError):
        req.end = time.monotonic()
        return
    req.end = time.monotonic()
    req.status, req.chunks = out.status, out.chunks
    req.ok = out.status == 200 and out.done and not out.error and not out.malformed


async def _load(args: argparse.Namespace, tide: Tide, gateway: str, client: Client) -> float:
    """Open-loop Poisson arrivals at ``tide.rate(t)`` for one compressed day; returns t0."""
    url = gateway + "/v1/chat/completions"
    rng = random.Random(args.seed)
    tasks: list[asyncio.Task[None]] = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        t = 0.0
        while t < args.day_s:
            t += rng.expovariate(max(tide.rate(t), 1e-3))
            delay = t0 + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            req = Req(time.monotonic(), max(16, int(rng.gauss(args.prompt_tokens, 200))))
            client.reqs.append(req)
            tasks.append(asyncio.create_task(_one(http, url, req, args.max_tokens)))
        await asyncio.wait(tasks, timeout=60)
    return t0


async def _sample(
    stub: Any, deployment: str, stop: asyncio.Event, out: list[tuple[float, int]]
) -> None:
    """``(monotonic s, instances starting, ready or draining)`` about every second, and one
    more at the end; each count holds until the next sample (so a slow ListInstances on a
    busy machine does not drop replica-time)."""
    live = (common_pb2.INSTANCE_STATE_STARTING, common_pb2.INSTANCE_STATE_READY,
            common_pb2.INSTANCE_STATE_DRAINING)  # fmt: skip
    while True:
        got = await stub.ListInstances(autoscaler_pb2.ListInstancesRequest(deployment=deployment))
        out.append((time.monotonic(), sum(1 for i in got.instances if i.state in live)))
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


def replica_seconds(samples: list[tuple[float, int]]) -> float:
    """Each sample's count times the time until the next sample."""
    return sum(n * (t1 - t0) for (t0, n), (t1, _) in itertools.pairwise(samples))


def kpa_target(args: argparse.Namespace, spec: DeploymentSpec) -> float:
    """Requests in flight per replica at 100 % for the reactive policy: ``--kpa-target``, or
    the product's own rule (``per_replica``) on the engines' profile and this workload's
    lengths (what an operator sets from a load test; the fit of an overloaded run is not)."""
    if args.kpa_target > 0:
        return float(args.kpa_target)
    cfg = PlannerConfig(policy="reactive", reactive=ReactiveConfig(target_utilization=1.0))
    w = WindowView(1, 1.0, args.prompt_tokens, args.max_tokens)
    return per_replica("worker", get_profile("test"), w, spec, cfg)


def planner_config(args: argparse.Namespace, spec: DeploymentSpec) -> PlannerConfig:
    """Times compressed like the trace where they are about the tide (forecast buckets of
    30 trace minutes, a one-day season, stabilisation windows of seconds); engine start-up
    is not compressed (the engines really start)."""
    reactive = ReactiveConfig(
        stable_window_s=args.stable_window_s, panic_window_s=args.panic_window_s,
        target_concurrency=kpa_target(args, spec),
    )  # fmt: skip
    return PlannerConfig(
        policy="reactive" if args.policy == "reactive" else "sla",
        interval_s=args.tick_s,
        window_s=args.panic_window_s if args.policy == "reactive" else args.window_s,
        predictor=args.predictor, bucket_s=args.day_s / 48, season_s=args.day_s,
        scale_down_window_s=args.stable_window_s, cooldown_s=args.window_s,
        reactive=reactive,
    )  # fmt: skip


def peak_sizing(args: argparse.Namespace, ttft_ms: float, tpot_ms: float, pct: float) -> int:
    """A static fleet for the peak: the planner's capacity rule (M/M/c prefill at the TTFT
    percentile, decode batch at the TPOT target) on the engines' profile at the peak rate."""
    perf = get_profile("test")
    demand = Demand(args.peak_rps, args.prompt_tokens, args.max_tokens)
    targets = Targets(ttft_ms, tpot_ms, pct)
    cfg = PlannerConfig()
    need = prefill_need(perf, demand, targets, cfg.max_utilization).replicas
    need += decode_need(perf, demand, targets, cfg.decode_headroom).replicas
    return math.ceil(need - 1e-9)


async def run(args: argparse.Namespace, pg_url: str, redis_url: str) -> dict[str, Any]:
    prefix, deployment = f"b{uuid.uuid4().hex[:8]}", f"live-{args.policy}"
    rates = load_tide(TRACE)
    day = rates[args.day * 144 : (args.day + 1) * 144]
    tide = Tide(day, args.day_s, args.peak_rps / max(day))
    client = Client()
    state = Path(tempfile.mkdtemp(prefix="ts-live-"))
    spec = load_spec_file(AGG.read_text())
    slo = spec.slo_classes[0]
    static = args.policy == "static"
    n0 = (args.static_replicas or peak_sizing(args, slo.ttft_ms, slo.tpot_ms, slo.percentile)
          ) if static else 1  # fmt: skip
    role = spec.roles[0].model_copy(
        update={"replicas": n0, "min_replicas": n0 if static else 1,
                "max_replicas": n0 if static else args.max_replicas}
    )  # fmt: skip
    spec = spec.model_copy(
        update={"name": deployment, "roles": (role,),
                "budget": spec.budget.model_copy(update={"max_replicas": args.max_replicas})}
    )  # fmt: skip
    counts: list[tuple[float, int]] = []  # (t, replicas starting, ready or draining)
    planner = None if static else planner_config(args, spec)
    async with live_stack(pg_url, redis_url, prefix, deployment, state, slo, planner) as stack:
        async with grpc.aio.insecure_channel(stack.autoscaler) as channel:
            stub: Any = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)
            await stub.ApplyDeployment(
                autoscaler_pb2.ApplyDeploymentRequest(spec=spec_to_proto(spec))
            )
            while True:
                got = await stub.GetDeployment(autoscaler_pb2.GetDeploymentRequest(name=deployment))
                if got.progress == "converged" and got.roles[0].ready == n0:
                    break
                await asyncio.sleep(0.2)
            stop = asyncio.Event()
            sampler = asyncio.create_task(_sample(stub, deployment, stop, counts))
            wall0 = time.time()
            await _load(args, tide, stack.gateway, client)
            stop.set()
            await sampler
            listed = await stub.ListDecisions(
                autoscaler_pb2.ListDecisionsRequest(deployment=deployment, limit=5000)
            )
            decisions = list(listed.decisions)
            plan = None if static else (
                await stub.Plan(autoscaler_pb2.PlanRequest(deployment=deployment))
            ).decision  # fmt: skip
        perf = await _perf_model(stack.telemetry, deployment)
    events = await _added(redis_url, f"{prefix}:membership")
    out = _report(args, client, counts, decisions, events, wall0, slo.ttft_ms, slo.tpot_ms, n0)
    out["forecast"] = json.loads(plan.forecast_json or "{}") if plan is not None else None
    out["last_plan_reasons"] = list(plan.reasons) if plan is not None else None
    out["fitted_model"] = perf
    if planner is not None:
        out["planner_config"] = planner.model_dump()
    return out


async def _perf_model(address: str, deployment: str) -> dict[str, Any]:
    """What telemetry fitted from the run (the planner's model at the end)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = telemetry_pb2_grpc.TelemetryServiceStub(channel)
        resp = await stub.GetPerfModel(
            telemetry_pb2.GetPerfModelRequest(deployment=deployment, role=common_pb2.ROLE_WORKER)
        )
    m = resp.model
    return {"samples": m.samples, "startup_s": round(m.startup_s, 3),
            "startup_samples": m.startup_samples, "prefill_ms_per_token": m.prefill_ms_per_token,
            "decode_base_ms": m.decode_base_ms}  # fmt: skip


async def _added(redis_url: str, stream: str) -> list[tuple[str, int]]:
    r = aioredis.Redis.from_url(redis_url, decode_responses=False)
    try:
        out = []
        for _id, fields in await r.xrange(stream):
            ev = decode_entry(fields, events_pb2.MembershipEvent)
            if ev.kind == ME.KIND_ADDED:
                out.append((ev.instance.instance_id, ev.ts_ms))
        return out
    finally:
        await r.aclose()


def attainment(
    reqs: list[Req], window_s: float, pct: float, ttft_target: float, tpot_target: float
) -> dict[str, Any]:
    """Windows of ``window_s`` (by send time) whose TTFT and TPOT at ``pct`` meet the targets
    (finished requests only; empty windows skipped)."""
    t0 = min((r.sent for r in reqs), default=0.0)
    windows: dict[int, list[Req]] = {}
    for r in reqs:
        if r.ok:
            windows.setdefault(int((r.sent - t0) // window_s), []).append(r)
    missed = {"ttft": 0, "tpot": 0}
    met = 0
    misses = []
    for k, w in sorted(windows.items()):
        p_ttft, p_tpot = _pct([r.ttft_ms for r in w], pct), _pct([r.tpot_ms for r in w], pct)
        ttft, tpot = p_ttft <= ttft_target, p_tpot <= tpot_target
        missed["ttft"] += not ttft
        missed["tpot"] += not tpot
        met += ttft and tpot
        if not (ttft and tpot):  # [window start s, requests, ttft p, tpot p]
            misses.append([round(k * window_s), len(w), round(p_ttft), round(p_tpot, 1)])
    n = len(windows)
    return {"window_s": window_s, "windows": n, "met": met,
            "attainment": round(met / n, 4) if n else None, "missed": missed,
            "missed_windows": misses}  # fmt: skip


def _report(
    args: argparse.Namespace, client: Client, counts: list[tuple[float, int]], decisions: list[Any],
    events: list[tuple[str, int]], wall0: float, ttft_target: float, tpot_target: float, n0: int,
) -> dict[str, Any]:  # fmt: skip
    reqs = client.reqs
    lost = [r for r in reqs if not r.ok]
    ups = sorted(
        d.ts_ms for d in decisions
        if d.changes and d.changes[0].to_replicas > d.changes[0].from_replicas
        and d.ts_ms >= wall0 * 1000
    )  # fmt: skip
    to_serving = []
    for _iid, ts in events:
        before = [u for u in ups if u <= ts]
        if before and ts >= wall0 * 1000:
            to_serving.append((ts - before[-1]) / 1000)
    acted = [d for d in decisions if d.changes and d.ts_ms >= wall0 * 1000]
    compress = 86_400.0 / args.day_s
    pct = 90.0
    return {
        "policy": args.policy,
        "command": command_line(),
        "machine": machine(),
        "trace": f"{TRACE.name} day {args.day}, {args.day_s:g} s per day, peak {args.peak_rps:g} rps",
        "telemetry": "the telemetry service (main.build): gateway records -> ingest -> "
        "QueryWindow; GetPerfModel fitted from the run (prior: the test profile)",
        "requests": len(reqs),
        "lost": len(lost),
        "lost_detail": sorted({f"status {r.status}" for r in lost})[:5],
        "slo": {"ttft_ms": ttft_target, "tpot_ms": tpot_target, "percentile": pct},
        "attainment": attainment(reqs, args.slo_window_s, pct, ttft_target, tpot_target),
        "attainment_60s": attainment(reqs, 60.0, pct, ttft_target, tpot_target),
        "replica_seconds": round(replica_seconds(counts), 1),
        "sampled_s": round(counts[-1][0] - counts[0][0], 1) if counts else 0.0,
        "replica_hours_trace": round(replica_seconds(counts) * compress / 3600.0, 1),
        "replicas_min_max": [min(n for _, n in counts), max(n for _, n in counts)],
        "replicas_every_10th_sample": [n for _, n in counts[::10]],
        "start_replicas": n0,
        "scaling_actions": len(acted),
        "decision_to_serving_s": {
            "n": len(to_serving),
            "p50": round(statistics.median(to_serving), 3) if to_serving else None,
            "max": round(max(to_serving), 3) if to_serving else None,
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", choices=("planner", "reactive", "static"), default="planner")
    ap.add_argument("--day", type=int, default=0, help="which trace day (0-13)")
    ap.add_argument("--day-s", type=float, default=600.0, help="seconds one trace day lasts")
    ap.add_argument("--peak-rps", type=float, default=42.0, help="the day's peak request rate")
    ap.add_argument("--prompt-tokens", type=int, default=1500, help="mean prompt length")
    ap.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    ap.add_argument("--max-replicas", type=int, default=10)
    ap.add_argument("--static-replicas", type=int, default=0, help="0 = sized for the peak")
    ap.add_argument("--predictor", default="constant",
                    choices=("constant", "moving_average", "holt_winters"))  # fmt: skip
    ap.add_argument("--tick-s", type=float, default=1.0, help="planner interval")
    ap.add_argument("--window-s", type=float, default=5.0, help="planner telemetry window")
    ap.add_argument("--stable-window-s", type=float, default=10.0,
                    help="scale-down stabilisation (planner) / stable window (reactive)")  # fmt: skip
    ap.add_argument("--panic-window-s", type=float, default=2.0, help="reactive: panic window")
    ap.add_argument("--kpa-target", type=float, default=0.0,
                    help="reactive: requests in flight per replica; 0 = from the model")  # fmt: skip
    ap.add_argument("--slo-window-s", type=float, default=5.0, help="attainment window")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-live-infra-"))
    pg = start_postgres(tmp / "pg")
    rd = start_redis(tmp / "redis", 0)
    try:
        result = asyncio.run(run(args, pg.url, rd.url))
    finally:
        rd.stop()
        pg.stop()
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
