"""The gRPC load client of `pick_rate.py` (its `_client` subcommand, run in a process of its
own): unary Pick + ReportOutcome or PickStream calls against a scheduler, with latency and
the share of picks a prefix scorer scored: ``prefix`` (the default profile's one estimate,
routed or precise) or ``kv-index`` (the precise-only profile's)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import deque
from typing import Any

from _pick_feeds import DEPLOYMENT, workload

PREFIX_SCORERS = ("prefix", "kv-index")


async def _client(port: int, work: list[tuple[int, tuple[int, ...]]], duration: float,
                  concurrency: int, profile: str, rpc: str = "unary",
                  streams: int = 1) -> dict[str, Any]:  # fmt: skip
    import grpc
    from tideserve.v1 import events_pb2, scheduler_pb2, scheduler_pb2_grpc

    reqs = [scheduler_pb2.PickRequest(deployment=DEPLOYMENT, block_hashes=list(h),
                                      prompt_tokens=t, max_tokens=128, profile=profile)
            for t, h in work]  # fmt: skip
    ok = errors = kv_scored = 0
    codes: dict[str, int] = {}
    lat: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        await asyncio.wait_for(ch.channel_ready(), 30.0)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        print("ready", flush=True)  # the parent starts metering the server here
        loop = asyncio.get_running_loop()
        warm_end = loop.time() + 1.0
        end = warm_end + duration

        def scored(resp: Any) -> bool:
            return any(sc.plugin in PREFIX_SCORERS and sc.score > 0 for sc in resp.decode.scores)

        async def worker(k: int) -> None:
            nonlocal ok, errors, kv_scored
            i = k
            while loop.time() < end:
                measuring = loop.time() >= warm_end
                t0 = time.perf_counter()
                try:
                    resp = await stub.Pick(reqs[i % len(reqs)])
                    dt = time.perf_counter() - t0
                    if measuring and scored(resp):
                        kv_scored += 1
                    await stub.ReportOutcome(scheduler_pb2.ReportOutcomeRequest(
                        pick_id=resp.pick_id, outcome=events_pb2.REQUEST_OUTCOME_OK))  # fmt: skip
                    if measuring:
                        ok += 1
                        lat.append(dt)
                except grpc.aio.AioRpcError as e:
                    if measuring:
                        errors += 1
                        codes[e.code().name] = codes.get(e.code().name, 0) + 1
                i += concurrency

        async def stream_worker(k: int, depth: int) -> None:
            """One PickStream with ``depth`` requests in flight; each answer's outcome rides
            on the next request written (PickRequest.report_outcomes)."""
            nonlocal ok, errors, kv_scored
            call = stub.PickStream()
            sent: deque[float] = deque()
            i = k

            async def send(outcome_of: str) -> None:
                nonlocal i
                r = reqs[i % len(reqs)]
                if outcome_of:
                    r = scheduler_pb2.PickRequest()
                    r.CopyFrom(reqs[i % len(reqs)])
                    r.report_outcomes.add(pick_id=outcome_of,
                                          outcome=events_pb2.REQUEST_OUTCOME_OK)  # fmt: skip
                sent.append(time.perf_counter())
                await call.write(r)
                i += streams

            for _ in range(depth):
                await send("")
            while sent:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    break
                dt = time.perf_counter() - sent.popleft()
                measuring = warm_end <= loop.time()
                if resp.HasField("error"):
                    if measuring:
                        errors += 1
                        name = _code_of(resp.error.code).name
                        codes[name] = codes.get(name, 0) + 1
                elif measuring:
                    ok += 1
                    lat.append(dt)
                    if scored(resp):
                        kv_scored += 1
                if loop.time() < end:
                    await send(resp.pick_id)
            await call.done_writing()

        if rpc == "stream":
            depth = max(1, concurrency // streams)
            await asyncio.gather(*(stream_worker(k, depth) for k in range(streams)))
        else:
            await asyncio.gather(*(worker(k) for k in range(concurrency)))
    lat.sort()

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 3) if lat else None

    return {"picks_ok": ok, "errors": errors, "error_codes": codes, "seconds": duration,
            "picks_with_prefix_score_above_0": kv_scored,
            "pick_latency_ms": {"p50": q(0.5), "p99": q(0.99)}}  # fmt: skip


def _code_of(number: int) -> Any:
    import grpc

    return next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)


def client_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pick_rate.py _client")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--trace", required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--profile", default="")
    p.add_argument("--rpc", choices=("unary", "stream"), default="unary")
    p.add_argument("--streams", type=int, default=1)
    a = p.parse_args(argv)
    work = workload(a.trace, a.requests, a.block_size)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = asyncio.run(_client(a.port, work, a.duration, a.concurrency, a.profile, a.rpc,
                              a.streams))  # fmt: skip
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    out["client_cpu_during_rpcs"] = {"cpu_s": round(cpu, 2),
                                     "percent_of_one_core": round(100 * cpu / wall, 1)}  # fmt: skip
    print(json.dumps(out))
    return 0
