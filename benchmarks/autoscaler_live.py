"""Live autoscaler evaluation (issue 11): a time-compressed ServeGen tide replayed through the
local stack with simulated engines and the local driver; prints one JSON object.

What runs, all real, on this machine: the scheduler service (gRPC + OpenAI HTTP gateway
following ``{prefix}:membership``), the autoscaler service as ``main.build`` wires it
(embedded Postgres, the planner loop, the seam, the reconciler over the ``local`` driver
starting ``tideserve engine --profile test`` processes, draining through ``Drain``), embedded
Redis, and an open-loop Poisson client whose rate follows one day of
``servegen_language_m-large_rate.csv`` compressed into ``--day-s`` seconds, scaled so the
day's peak is ``--peak-rps``.

Not real: telemetry. The telemetry service on main does not answer ``QueryWindow`` yet, so
this script serves the ``TelemetryService`` contract itself from what its own client
measured over the last window (requests sent, prompt and output tokens, TTFT/TPOT
percentiles of the requests that finished); the performance model is the engines' ``test``
profile fitted to the proto's coefficients, with ``--startup-s`` as the start-up time.

Policies: ``planner`` (min 1, max ``--max-replicas``, starting at 1) and ``static`` (the
planner off, ``--static-replicas`` from the start). Reported per policy: requests sent and
lost (non-200, cut streams, errors), SLO attainment over ``--slo-window-s`` windows (TTFT and
TPOT at p90 against the spec's targets, windows with no finished request skipped),
replica-seconds (instances starting, ready or draining, sampled every second), scaling
actions, and decision -> serving (a scale-out decision's ts to each new instance's ADDED
event on the membership stream, which the gateway follows).

    .venv/bin/python benchmarks/autoscaler_live.py --policy planner
    .venv/bin/python benchmarks/autoscaler_live.py --policy static
"""

from __future__ import annotations

import argparse
import asyncio
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
from tideserve.v1 import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    common_pb2,
    events_pb2,
    telemetry_pb2,
    telemetry_pb2_grpc,
)

from services.autoscaler.drivers.settings import DriverSettings, LocalSettings
from services.autoscaler.planner import PlannerConfig
from services.autoscaler.settings import AutoscalerSettings
from services.autoscaler.spec import load_spec_file
from services.autoscaler.translate import spec_to_proto
from services.common.embedded import start_postgres, start_redis
from services.common.perfmodel import get_profile
from services.common.streams import decode_entry
from tests.helpers.autoscale import autoscaler_service, gateway_settings
from tests.helpers.engine_stack import stream_sse
from tests.helpers.ports import free_ports
from tests.helpers.scheduler import scheduler_service

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


class MeasuredTelemetry(telemetry_pb2_grpc.TelemetryServiceServicer):  # type: ignore[misc]
    """``QueryWindow`` from the client's own records; ``GetPerfModel`` from the profile."""

    def __init__(self, client: Client, out_tokens: int, model: telemetry_pb2.PerfModel) -> None:
        self.client, self.out_tokens, self.model = client, out_tokens, model

    async def QueryWindow(self, request: Any, context: Any) -> Any:
        now = time.monotonic()
        recent = [r for r in self.client.reqs if r.sent >= now - request.window_s]
        done = [r for r in recent if r.ok]
        ttft = [r.ttft_ms for r in done]
        tpot = [r.tpot_ms for r in done]
        w = telemetry_pb2.WindowStats(
            requests=len(recent),
            request_rate_rps=len(recent) / request.window_s,
            input_tokens=telemetry_pb2.Percentiles(
                mean=statistics.fmean([r.prompt_tokens for r in recent]) if recent else 0
            ),
            output_tokens=telemetry_pb2.Percentiles(mean=self.out_tokens),
            ttft_ms=telemetry_pb2.Percentiles(
                p50=_pct(ttft, 50), p90=_pct(ttft, 90), p99=_pct(ttft, 99)
            ),
            tpot_ms=telemetry_pb2.Percentiles(
                p50=_pct(tpot, 50), p90=_pct(tpot, 90), p99=_pct(tpot, 99)
            ),
        )
        return telemetry_pb2.QueryWindowResponse(total=w)

    async def GetPerfModel(self, request: Any, context: Any) -> Any:
        m = telemetry_pb2.PerfModel()
        m.CopyFrom(self.model)
        m.role = request.role
        return telemetry_pb2.GetPerfModelResponse(model=m)


def fitted_model(profile: str, startup_s: float) -> telemetry_pb2.PerfModel:
    """The profile's step times as the proto's coefficients (least squares)."""
    p = get_profile(profile)
    n = np.array([64, 256, 512, 1024, 2048, 4096], dtype=float)
    pre = np.polyfit(n, [p.prefill_ms(int(x)) for x in n], 2)
    pts = [(b, c) for b in (1, 4, 16, 64) for c in (500, 2000, 8000)]
    a = np.array([[1.0, b, b * c / 1000.0] for b, c in pts])
    y = np.array([p.decode_step_ms(b, c) for b, c in pts])
    dec = np.linalg.lstsq(a, y, rcond=None)[0]
    return telemetry_pb2.PerfModel(
        profile=profile,
        prefill_base_ms=max(0.0, pre[2]), prefill_ms_per_token=max(0.0, pre[1]),
        prefill_ms_per_token2=max(0.0, pre[0]), decode_base_ms=max(0.0, dec[0]),
        decode_ms_per_seq=max(0.0, dec[1]), decode_ms_per_ktoken=max(0.0, dec[2]),
        samples=1, startup_s=startup_s, startup_samples=1,
    )  # fmt: skip


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


async def _sample(stub: Any, deployment: str, stop: asyncio.Event, out: list[int]) -> None:
    live = (common_pb2.INSTANCE_STATE_STARTING, common_pb2.INSTANCE_STATE_READY,
            common_pb2.INSTANCE_STATE_DRAINING)  # fmt: skip
    while not stop.is_set():
        got = await stub.ListInstances(autoscaler_pb2.ListInstancesRequest(deployment=deployment))
        out.append(sum(1 for i in got.instances if i.state in live))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


async def run(args: argparse.Namespace, pg_url: str, redis_url: str) -> dict[str, Any]:
    prefix, deployment = f"b{uuid.uuid4().hex[:8]}", f"live-{args.policy}"
    sched_grpc, sched_http, as_port, base = free_ports(4)
    rates = load_tide(TRACE)
    day = rates[args.day * 144 : (args.day + 1) * 144]
    tide = Tide(day, args.day_s, args.peak_rps / max(day))
    client = Client()
    telemetry = MeasuredTelemetry(client, args.max_tokens, fitted_model("test", args.startup_s))
    tserver = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(telemetry, tserver)
    tport = tserver.add_insecure_port("127.0.0.1:0")
    await tserver.start()
    state = Path(tempfile.mkdtemp(prefix="ts-live-"))
    planner = args.policy == "planner"
    settings = AutoscalerSettings(
        grpc_port=as_port, metrics_port=0, postgres_url=pg_url, redis_url=redis_url,
        stream_prefix=prefix, state_dir=state / "autoscaler", load_poll_s=0.5,
        telemetry_address=f"127.0.0.1:{tport}", planner_enabled=planner, hold_record_s=3600,
        planner=PlannerConfig(
            interval_s=args.tick_s, window_s=args.window_s, predictor="constant",
            scale_down_window_s=args.window_s * 2, cooldown_s=args.window_s,
        ),
        driver=DriverSettings(
            kind="local", scheduler_addresses=[f"127.0.0.1:{sched_grpc}"], resync_s=0.5,
            retry_base_s=0.2, drain_timeout_s=30, drain_poll_s=0.05,
            local=LocalSettings(port_min=base, port_max=base + 60, probe_interval_s=0.05,
                                state_dir=str(state / "engines"), stop_grace_s=0.05),
        ),
    )  # fmt: skip
    spec = load_spec_file(AGG.read_text())
    n0 = 1 if planner else args.static_replicas
    role = spec.roles[0].model_copy(
        update={"replicas": n0, "min_replicas": 1 if planner else n0,
                "max_replicas": args.max_replicas if planner else n0}
    )  # fmt: skip
    spec = spec.model_copy(
        update={"name": deployment, "roles": (role,),
                "budget": spec.budget.model_copy(update={"max_replicas": args.max_replicas})}
    )  # fmt: skip
    slo = spec.slo_classes[0]
    sched = gateway_settings(redis_url, state, prefix, deployment, sched_grpc, sched_http)
    counts: list[int] = []
    try:
        async with scheduler_service(sched), autoscaler_service(settings) as address:
            async with grpc.aio.insecure_channel(address) as channel:
                stub: Any = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)
                await stub.ApplyDeployment(
                    autoscaler_pb2.ApplyDeploymentRequest(spec=spec_to_proto(spec))
                )
                while True:
                    got = await stub.GetDeployment(
                        autoscaler_pb2.GetDeploymentRequest(name=deployment)
                    )
                    if got.progress == "converged" and got.roles[0].ready == n0:
                        break
                    await asyncio.sleep(0.2)
                stop = asyncio.Event()
                sampler = asyncio.create_task(_sample(stub, deployment, stop, counts))
                wall0 = time.time()
                await _load(args, tide, f"http://127.0.0.1:{sched_http}", client)
                stop.set()
                await sampler
                decisions = list(
                    (
                        await stub.ListDecisions(
                            autoscaler_pb2.ListDecisionsRequest(deployment=deployment, limit=1000)
                        )
                    ).decisions
                )
        events = await _added(redis_url, f"{prefix}:membership")
    finally:
        await tserver.stop(None)
    return _report(args, client, counts, decisions, events, wall0, slo.ttft_ms, slo.tpot_ms, n0)


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


def _report(
    args: argparse.Namespace, client: Client, counts: list[int], decisions: list[Any],
    events: list[tuple[str, int]], wall0: float, ttft_target: float, tpot_target: float, n0: int,
) -> dict[str, Any]:  # fmt: skip
    reqs = client.reqs
    lost = [r for r in reqs if not r.ok]
    t0 = min((r.sent for r in reqs), default=0.0)
    windows: dict[int, list[Req]] = {}
    for r in reqs:
        if r.ok:
            windows.setdefault(int((r.sent - t0) // args.slo_window_s), []).append(r)
    met = [
        _pct([r.ttft_ms for r in w], 90) <= ttft_target
        and _pct([r.tpot_ms for r in w], 90) <= tpot_target
        for w in windows.values()
    ]
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
    return {
        "policy": args.policy,
        "command": command_line(),
        "machine": machine(),
        "trace": f"{TRACE.name} day {args.day}, {args.day_s:g} s per day, peak {args.peak_rps:g} rps",
        "telemetry": "measured by this script's client (the telemetry service has no "
        "QueryWindow yet); perf model = the test profile fitted",
        "requests": len(reqs),
        "lost": len(lost),
        "slo": {"ttft_ms_p90": ttft_target, "tpot_ms_p90": tpot_target},
        "windows": len(met),
        "windows_in_slo": sum(met),
        "attainment": round(sum(met) / len(met), 4) if met else None,
        "replica_seconds": sum(counts),
        "replicas_min_max": [min(counts, default=0), max(counts, default=0)],
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
    ap.add_argument("--policy", choices=("planner", "static"), default="planner")
    ap.add_argument("--day", type=int, default=0, help="which trace day (0-13)")
    ap.add_argument("--day-s", type=float, default=120.0, help="seconds one trace day lasts")
    ap.add_argument("--peak-rps", type=float, default=14.0, help="the day's peak request rate")
    ap.add_argument("--prompt-tokens", type=int, default=1500, help="mean prompt length")
    ap.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    ap.add_argument("--max-replicas", type=int, default=6)
    ap.add_argument("--static-replicas", type=int, default=4)
    ap.add_argument("--startup-s", type=float, default=2.0, help="start-up time in the model")
    ap.add_argument("--tick-s", type=float, default=1.0, help="planner interval")
    ap.add_argument("--window-s", type=float, default=5.0, help="telemetry window")
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
