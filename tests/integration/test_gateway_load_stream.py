"""Engine load snapshots on real Redis feed the gateway's fleet: a simulated engine's
``ts:load:{deployment}`` snapshots win over ``/metrics`` scraping while fresh, scraping
takes over when they stop, and hand-made snapshots check the figures, ordering, URL
matching and the counters."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from tideserve.v1 import common_pb2, events_pb2

from services.common.scheduling import EndpointSpec, build_core
from services.common.streams import StreamProducer, stream_name
from services.scheduler.feeds.load_stream import LoadStream
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.integration._engine_proc import engine_process

DEP = "dep"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_engine_snapshots_win_while_fresh_then_scraping_takes_over(
    redis: aioredis.Redis, redis_url: str, servers: Callable[[Any], Any], tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    async with engine_process(
        tmp_path,
        "--instance-id",
        "e1",
        "--redis-url",
        redis_url,
        "--deployment",
        DEP,
        "--stream-prefix",
        prefix,
    ) as url:
        await _snapshots_then_scrape(redis, prefix, url, servers)


async def _snapshots_then_scrape(
    redis: aioredis.Redis, prefix: str, url: str, servers: Callable[[Any], Any]
) -> None:
    clock = Clock()
    core = build_core([EndpointSpec("e1", url, deployment=DEP)], perf_profile="test")
    core.fleet.stream_stale_s = 2.0
    gw = Gateway(core, GatewayOptions(background=False, deployment=DEP), clock=clock)
    await servers(gw.app())  # starts the gateway's HTTP session (used by poll_load)
    ls = LoadStream(redis, core.fleet, deployment=DEP, prefix=prefix, clock=clock, block_ms=500)
    for _ in range(50):
        await ls.poll_once()
        if ls.stats["applied"]:
            break
    assert ls.stats["applied"] >= 1 and ls.stats["unknown"] == 0
    assert core.fleet.load_source("e1", clock()) == "stream"
    assert not core.fleet.needs_scrape("e1", clock())
    # no fresh snapshot for longer than the bound: /metrics scraping is the fallback
    clock.t += 5.0
    assert core.fleet.needs_scrape("e1", clock())
    assert core.fleet.load_source("e1", clock()) == "none"
    await gw.poll_load()
    assert core.fleet.load_source("e1", clock()) == "scrape"
    # snapshots resume: the stream wins again
    applied = ls.stats["applied"]
    for _ in range(50):
        await ls.poll_once()
        if ls.stats["applied"] > applied:
            break
    assert core.fleet.load_source("e1", clock()) == "stream"


def _snap(iid: str, ts: int, running: int, url: str = "") -> events_pb2.LoadSnapshot:
    return events_pb2.LoadSnapshot(
        deployment=DEP,
        instance_id=iid,
        epoch=7,
        ts_ms=ts,
        role=common_pb2.ROLE_WORKER,
        num_running=running,
        num_waiting=4,
        kv_usage=0.25,
        tokens_in_flight=5000,
        pending_prefill_tokens=1200,
        prefill_tokens_per_s=30_000.0,
        decode_tokens_per_s=900.0,
        endpoint=common_pb2.Endpoint(url=url),
    )


async def test_snapshot_figures_ordering_and_counters(redis: aioredis.Redis) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    clock = Clock()
    core = build_core(
        [
            EndpointSpec("127.0.0.1:30001", "http://127.0.0.1:30001", deployment=DEP),
            EndpointSpec("127.0.0.1:30002", "http://127.0.0.1:30002", deployment=DEP),
        ],
        perf_profile="test",
    )
    ls = LoadStream(redis, core.fleet, deployment=DEP, prefix=prefix, clock=clock, block_ms=100)
    stream = stream_name(prefix, "load", DEP)
    p = StreamProducer(redis)
    await p.publish(stream, _snap("127.0.0.1:30001", 1, running=77))
    await ls.poll_once(block_ms=1)  # starts after the last entry: older ones are never read
    assert ls.last_id != "$" and ls.stats["applied"] == 0
    await p.publish_many(
        stream,
        [
            _snap("127.0.0.1:30001", 100, running=3),
            _snap("127.0.0.1:30001", 90, running=99),  # older: ignored
            _snap("engine-b", 100, running=6, url="http://127.0.0.1:30002"),  # by URL
            _snap("engine-z", 100, running=1, url="http://127.0.0.1:39999"),  # unknown
        ],
    )
    await redis.xadd(stream, {b"t": b"tideserve.v1.LoadSnapshot", b"p": b"\xff\xfe"})
    n = 0
    for _ in range(20):
        n += await ls.poll_once()
        if n >= 5:
            break
    assert ls.stats == {
        "applied": 2,
        "stale": 1,
        "unknown": 1,
        "other_deployment": 0,
        "undecodable": 1,
        "errors": 0,
    }
    a = core.fleet.view("127.0.0.1:30001", clock())
    assert (a.running, a.waiting, a.tokens_in_flight, a.pending_prefill_tokens) == (
        3,
        4,
        5000,
        1200,
    )
    assert (a.kv_usage, a.prefill_tokens_per_s) == (0.25, 30_000.0)
    assert core.fleet.view("127.0.0.1:30002", clock()).running == 6
    # the background reader ends cleanly while blocked in XREAD
    ls.start()
    await asyncio.sleep(0.05)
    await ls.stop()
    await ls.stop()  # idempotent
