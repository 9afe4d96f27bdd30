"""The local driver and the reconciler scale a running gateway up and down under load, with
no request lost on scale-in.

Real processes and services: the scheduler service (gRPC + OpenAI HTTP gateway) following
``{prefix}:membership`` on the test Redis, simulated engine processes started by the local
driver. Closed-loop clients keep streamed requests in flight the whole time. Scale 1 -> 3:
the new engines are announced (ADDED) once ready and the gateway routes to them. Scale
3 -> 1 while requests are in flight: each victim is announced DRAINING, drained through the
scheduler's ``Drain`` until neither the gateway nor the engine holds a request, and only then
stopped (REMOVED). Every request sent is answered 200 and complete."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.streams import decode_entry
from tests.helpers.autoscale import ClosedLoop, Rig, autoscaled_gateway
from tests.helpers.waits import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ME = events_pb2.MembershipEvent


async def test_scale_up_and_down_under_load_loses_nothing(redis_url: str, tmp_path: Path) -> None:
    # SIGKILL 50 ms after SIGTERM: the engine cannot finish requests itself on SIGTERM, so
    # only the drain keeps them from being lost (with drain_timeout_s=0.0001 this test fails)
    async with autoscaled_gateway(redis_url, tmp_path, stop_grace_s=0.05) as rig:
        rig.reconciler.apply(rig.target(1, "e2e: start"))

        async def serving(n: int) -> bool:
            status = rig.reconciler.status(rig.deployment)
            return len(await rig.serving()) == n and status is not None and status.converged

        await eventually(lambda: serving(1), within_s=90)
        (first,) = await rig.serving()

        # requests of ~1 s, so that one seen in flight is still there when the drain begins
        load = ClosedLoop(rig.gateway, clients=6, max_tokens=1000)
        load.start()
        await eventually(lambda: _answered(load, 6), within_s=60)

        rig.reconciler.apply(rig.target(3, "e2e: scale-out"))
        await eventually(lambda: serving(3), within_s=90)
        grown = await rig.serving()
        more = len(load.outcomes) + 12  # the grown fleet serves a while
        await eventually(lambda: _answered(load, more), within_s=60)
        # the caller's victim is serving when the scale-in comes (a drain that finds nothing
        # in flight proves nothing)
        await eventually(lambda: _busy(rig, first), within_s=30)

        rig.reconciler.apply(rig.target(1, "e2e: scale-in"), {"worker": [first]})
        await eventually(lambda: serving(1), within_s=90)
        await eventually(lambda: _gone(rig, 1), within_s=60)
        (left,) = await rig.serving()
        await load.stop()

    # the caller's victim went first; the driver chose the second
    victims = grown - {left}
    assert first in victims and len(victims) == 2
    # nothing lost: every request sent was answered 200 with a complete stream
    assert load.sent == len(load.outcomes) > 20
    assert load.failures() == []
    # each victim was drained to zero before it was stopped, and the caller's still had
    # requests in flight when its drain began
    drains = dict(rig.drainer.results)
    assert set(drains) == victims
    assert all(r.drained for r in drains.values()), drains
    assert drains[first].polls > 1, drains
    # membership: ADDED when ready, DRAINING, then REMOVED, in that order
    for victim in victims:
        kinds = [(k, s) for i, k, s in await _events_of(rig, redis_url) if i == victim]
        assert kinds == [
            (ME.KIND_ADDED, 2),
            (ME.KIND_STATE_CHANGED, 3),
            (ME.KIND_REMOVED, 4),
        ], kinds


async def _answered(load: ClosedLoop, n: int) -> bool:
    return len(load.outcomes) >= n


async def _busy(rig: Rig, instance_id: str) -> bool:
    return await rig.in_flight(instance_id) > 0


async def _gone(rig: Rig, n: int) -> bool:
    return len(rig.reconciler.instances(rig.deployment)) == n


async def _events_of(rig: Rig, redis_url: str) -> list[tuple[str, int, int]]:
    """(instance, kind, state) of every membership event, in order."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    try:
        out = []
        for _id, fields in await client.xrange(rig.stream):
            ev = decode_entry(fields, events_pb2.MembershipEvent)
            out.append((ev.instance.instance_id, ev.kind, ev.instance.state))
        return out
    finally:
        await client.aclose()
