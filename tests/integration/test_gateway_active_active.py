"""Active-active gateway replicas sharing routed prefixes and in-flight load through a
real Redis (two cores in one process, each with its own SharedState; clocks injected)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest
from tideserve.v1 import events_pb2

from services.common.admission.shaper import DispatchShaper
from services.common.admission.shaper_config import ShaperConfig
from services.common.routing.types import Pick, RequestView
from services.common.scheduling import EndpointSpec, GatewayCore, build_core
from services.common.streams import encode_entry
from services.scheduler.admission.dispatch import DispatchOrder
from services.scheduler.feeds.shared import SharedState
from tests.helpers.views import request_view

IDS = ["a", "b", "c"]
TURN1 = list(range(1, 257))
TURN2 = TURN1 + list(range(900, 964))


class Wall:
    """A settable wall clock (epoch seconds), starting at the real time (Redis stream ids
    come from the server's clock)."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def view(rid: str, tokens: list[int], **kw: Any) -> RequestView:
    return request_view(rid, tokens=tokens, block_size=16, **kw)


Replica = Callable[..., SharedState]


@pytest.fixture
async def replicas(redis_client: Any) -> AsyncIterator[Replica]:
    made: list[SharedState] = []
    dep = f"aa-{uuid.uuid4().hex[:8]}"

    def make(replica_id: str, wall: Wall, **kw: Any) -> SharedState:
        core = build_core(
            [EndpointSpec(i, f"http://{i}") for i in IDS], perf_profile="test", block_size=16
        )
        s = SharedState(redis_client, core, deployment=dep, replica_id=replica_id, wall=wall, **kw)
        core.pick_listeners.append(s.on_pick)  # what start() does, without the tasks
        made.append(s)
        return s

    yield make
    for s in made:
        await s.stop()


def pick_on(core: GatewayCore, v: RequestView, now: float, pick_id: str) -> str:
    d = core.pick(v, now, pick_id)
    assert isinstance(d, Pick), d
    return d.decode.endpoint.instance_id


async def test_routed_prefix_reaches_the_other_replica(replicas: Replica) -> None:
    wall = Wall()
    a, b = replicas("A", wall), replicas("B", wall)
    await b.read_once(block_ms=0)  # B is up before A routes anything
    # A routes turn 1 to 'c' (the others excluded, so it is not the tie-break winner).
    assert pick_on(a.core, view("t1", TURN1, exclude=frozenset({"a", "b"})), 1.0, "t1") == "c"
    a.core.release("t1")
    assert await a.publish_once() == 1
    assert await b.read_once(block_ms=0) == 1
    assert b.stats["applied"] == 1
    # A is gone; turn 2 through B lands where the prefix is.
    assert pick_on(b.core, view("t2", TURN2), 2.0, "t2") == "c"
    # B's own entry comes back to B on its stream and is ignored, A applies it.
    b.core.release("t2")
    assert await b.publish_once() == 1
    assert await b.read_once(block_ms=0) == 1 and b.stats["ignored"] == 1
    assert await a.read_once(block_ms=0) == 2
    assert a.stats == a.stats | {"applied": 1, "ignored": 1}


async def test_late_replica_catches_up_within_the_window(replicas: Replica) -> None:
    wall = Wall()
    a = replicas("A", wall)
    assert pick_on(a.core, view("t1", TURN1, exclude=frozenset({"a", "c"})), 1.0, "t1") == "b"
    await a.publish_once()
    wall.t += 5.0
    late = replicas("late", wall, catchup_s=60.0)
    assert await late.read_once(block_ms=0) == 1 and late.stats["applied"] == 1
    assert pick_on(late.core, view("t2", TURN2), 1.0, "t2") == "b"
    too_late = replicas("too-late", wall, catchup_s=1.0)  # starts reading after the entry
    assert await too_late.read_once(block_ms=0) == 0
    assert pick_on(too_late.core, view("t3", TURN2), 1.0, "t3") == "a"


async def test_undecodable_entries_are_counted_and_skipped(
    replicas: Replica, redis_client: Any
) -> None:
    wall = Wall()
    a = replicas("A", wall)
    await a.read_once(block_ms=0)
    await redis_client.xadd(a.stream, {b"t": b"tideserve.v1.RoutedPrefix", b"p": b"\xff\xff"})
    await redis_client.xadd(a.stream, encode_entry(events_pb2.LoadSnapshot()))
    assert await a.read_once(block_ms=0) == 2
    assert a.stats["undecodable"] == 2 and a.stats["applied"] == 0


async def test_in_flight_is_shared_and_drops_out_when_a_replica_dies(
    replicas: Replica, redis_client: Any
) -> None:
    wall = Wall()
    a, b, c = replicas("A", wall), replicas("B", wall), replicas("C", wall)
    for i in range(3):
        a.core.fleet.reserve(f"a{i}", ["a"], {"a": 100}, 0.0)
    b.core.fleet.reserve("b0", ["a", "b"], {"b": 50}, 0.0)
    await a.heartbeat_once()
    await b.heartbeat_once()
    await c.heartbeat_once()
    snap = {
        e.instance_id: (e.reserved_requests, e.reserved_tokens) for e in c.core.fleet.snapshot(0)
    }
    assert snap == {"a": (4, 300), "b": (1, 50), "c": (0, 0)}
    await a.heartbeat_once()  # A's first beat ran before B's existed
    a_view = a.core.fleet.view("a", 0.0)
    assert (a_view.reserved_requests, a_view.reserved_tokens) == (4, 300)  # 3 own + 1 of B's
    # A dies (no more heartbeats, no clean stop); B and C keep beating.
    wall.t += 2.0
    await b.heartbeat_once()
    await c.heartbeat_once()
    assert c.core.fleet.view("a", 0.0).reserved_requests == 4  # within the TTL
    wall.t += 1.5
    await b.heartbeat_once()
    await c.heartbeat_once()
    assert c.core.fleet.view("a", 0.0).reserved_requests == 1  # A's heartbeat expired
    # B stops cleanly: its field leaves the hash at once.
    b.core.fleet.release("b0")
    await b.stop()
    await c.heartbeat_once()
    assert c.core.fleet.view("a", 0.0).reserved_requests == 0
    fields = await redis_client.hkeys(c.hash_key)
    assert b"B" not in fields and b"C" in fields


async def test_dispatch_orders_hold_prompts_by_the_whole_instance_backlog(
    replicas: Replica,
) -> None:
    wall = Wall()
    orders = [DispatchOrder(DispatchShaper(ShaperConfig(hold_above_ms=500.0)), wall) for _ in "AB"]
    a = replicas("A", wall, dispatch=orders[0])
    b = replicas("B", wall, dispatch=orders[1])
    assert orders[0].offer("long", "a", 2_000.0) is None  # A sends a 2 s prefill to 'a'
    await a.heartbeat_once()
    await b.heartbeat_once()
    waiting = orders[1].offer("next", "a", 300.0)  # B alone would send it: 'a' is idle to B
    assert waiting is not None and not waiting.done()
    assert orders[1].offer("elsewhere", "b", 300.0) is None
    orders[0].first_byte("long")  # A's prefill ended early: its next heartbeat has no backlog
    await a.heartbeat_once()
    await b.heartbeat_once()
    assert waiting.done()
    await orders[1].wait("next", waiting)
    for o in orders:
        o.close()


async def test_redis_outage_keeps_routing_and_expires_remote_counts(replicas: Replica) -> None:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    wall = Wall()
    a, b = replicas("A", wall), replicas("B", wall)
    a.core.fleet.reserve("x", ["c"], {}, 0.0)
    await a.heartbeat_once()
    await b.heartbeat_once()
    assert b.core.fleet.view("c", 0.0).reserved_requests == 1
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    dead = aioredis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    b.redis = dead
    b._producer = replace_producer(dead)
    wall.t += 10.0
    with pytest.raises((RedisError, OSError)):
        await b.heartbeat_once()
    assert b.core.fleet.view("c", 0.0).reserved_requests == 0  # stale counts expired anyway
    assert pick_on(b.core, view("o1", TURN1), 1.0, "o1") in IDS  # routing goes on
    with pytest.raises((RedisError, OSError)):
        await b.publish_once()
    assert b.stats["dropped"] == 1
    await dead.aclose()


def replace_producer(client: Any) -> Any:
    from services.common.streams import StreamProducer

    return StreamProducer(client)


async def test_start_stop_tasks_share_state_live(replicas: Replica) -> None:
    """The real loops: A's pick reaches B without calling the steps by hand."""
    import asyncio

    wall = Wall()
    a, b = replicas("A", wall, heartbeat_s=0.05), replicas("B", wall, heartbeat_s=0.05)
    a.core.pick_listeners.clear()
    b.core.pick_listeners.clear()
    await a.start()
    await b.start()
    try:
        assert pick_on(a.core, view("t1", TURN1, exclude=frozenset({"a"})), 1.0, "t1") == "b"
        for _ in range(200):
            if b.stats["applied"]:
                break
            await asyncio.sleep(0.02)
        assert b.stats["applied"] == 1
        assert pick_on(b.core, replace(view("t2", TURN2)), 2.0, "t2") == "b"
        for _ in range(200):
            if a.core.fleet.view("b", 0.0).reserved_requests == 2:
                break
            await asyncio.sleep(0.02)
        assert a.core.fleet.view("b", 0.0).reserved_requests == 2  # own t1 + B's t2
    finally:
        await a.stop()
        await b.stop()
    assert a.on_pick not in a.core.pick_listeners


async def test_integrations_from_settings_export_counters(redis_url: str) -> None:
    from prometheus_client import CollectorRegistry

    from services.scheduler.feeds.integrations import Integrations
    from services.scheduler.http.server import Gateway
    from services.scheduler.settings import SchedulerSettings

    core = build_core([EndpointSpec("a", "http://a")], perf_profile="test", block_size=16)
    gw = Gateway(core)
    settings = SchedulerSettings(
        redis_url=redis_url,
        share_state=True,
        kvmeta_address="127.0.0.1:1",
        stream_prefix=f"it{uuid.uuid4().hex[:6]}",
    )
    registry = CollectorRegistry()
    x = Integrations(settings, core, gw, registry=registry)
    assert x.sink is not None and x.shared is not None and gw.prefix_lookup is x.lookup
    assert x.replica_id  # generated
    await x.start()
    try:
        assert x.shared.on_pick in core.pick_listeners
        d = core.pick(view("r", TURN1), 1.0, "p")
        assert isinstance(d, Pick)
        await x.shared.publish_once()
        assert (
            registry.get_sample_value("tideserve_gateway_shared_total", {"event": "published"})
            == 1.0
        )
        assert (
            registry.get_sample_value("tideserve_gateway_records_total", {"event": "dropped"})
            == 0.0
        )
        assert (
            registry.get_sample_value("tideserve_gateway_kvmeta_lookups_total", {"result": "calls"})
            == 0.0
        )
    finally:
        await x.stop()
        await x.stop()  # idempotent
    assert (
        registry.get_sample_value("tideserve_gateway_shared_total", {"event": "published"}) is None
    )


async def test_stop_while_the_reader_blocks_never_hangs(replicas: Replica) -> None:
    """Regression: cancelling a blocking XREAD mid-read could hang stop() forever; stop now
    lets the read return (block_ms) and ends the loops cooperatively."""
    wall = Wall()
    for i in range(5):
        s = replicas(f"R{i}", wall, block_ms=100, heartbeat_s=0.05, heartbeat_ttl_s=1.0)
        s.core.pick_listeners.clear()
        await s.start()
        s.on_pick(view("x", TURN1), pick_of(s.core), 1.0)
        await asyncio.sleep(0.03)  # the reader is inside its blocking XREAD now
        await asyncio.wait_for(s.stop(), 30)  # a hang fails here, not at the suite timeout
        assert not s._tasks and s.stats["published"] == 1


def pick_of(core: GatewayCore) -> Pick:
    d = core.scheduler.schedule(view("y", TURN1), core.fleet.snapshot(0.0), 0.0)
    assert isinstance(d, Pick)
    return d


async def test_abandoned_pick_is_retracted_everywhere(replicas: Replica) -> None:
    wall = Wall()
    a, b = replicas("A", wall), replicas("B", wall)
    a.core.settle_listeners.append(a.on_settle)  # what start() does, without the tasks
    await b.read_once(block_ms=0)
    assert pick_on(a.core, view("t1", TURN1, exclude=frozenset({"a", "b"})), 1.0, "t1") == "c"
    a.core.abandon("t1")  # the engine failed before its first byte
    a.core.release("t1")
    assert await a.publish_once() == 2
    assert await b.read_once(block_ms=0) == 2 and b.stats["applied"] == 2
    assert pick_on(b.core, view("t2", TURN2), 2.0, "t2") == "a"  # no affinity to 'c' left


async def test_a_turn_waits_for_its_carrier_on_the_other_replica(replicas: Replica) -> None:
    """A session's turn reaches replica B while its previous turn (the carrier) still
    prefills, sent by replica A: B holds the new turn until A's first byte is announced,
    then sends it (it hits the carrier's prefix instead of computing it again)."""
    wall = Wall()
    cfg = ShaperConfig(hold_above_ms=150.0, follow_max_ms=30_000.0)
    orders = [DispatchOrder(DispatchShaper(cfg), wall) for _ in "AB"]
    a = replicas("A", wall, dispatch=orders[0])
    b = replicas("B", wall, dispatch=orders[1])
    a.core.settle_listeners.append(a.on_settle)  # what start() does, without the tasks
    await b.read_once(block_ms=0)
    v1 = view("t1", TURN1, exclude=frozenset({"a", "b"}))
    d1 = a.core.pick(v1, 1.0, "t1")
    assert isinstance(d1, Pick) and d1.decode.endpoint.instance_id == "c"
    assert orders[0].offer("t1", "c", 2_000.0, prefix=v1.block_hashes) is None
    assert await a.publish_once() == 1
    assert await b.read_once(block_ms=0) == 1
    v2 = view("t2", TURN2)
    waiting = orders[1].offer("t2", "c", 100.0, prefix=v2.block_hashes)
    assert waiting is not None and not waiting.done()
    # another prompt for the same instance, sharing nothing, is not held
    other = view("x", list(range(5000, 5064))).block_hashes
    assert orders[1].offer("x", "c", 10.0, prefix=other) is None
    orders[0].first_byte("t1")
    a.core.first_token("t1")  # settled ok: A announces the answer
    assert await a.publish_once() == 1
    assert not waiting.done()
    assert await b.read_once(block_ms=0) == 1
    assert waiting.done()
    await orders[1].wait("t2", waiting)
    for o in orders:
        o.close()
