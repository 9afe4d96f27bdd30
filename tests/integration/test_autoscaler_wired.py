"""The autoscaler service as ``main.build`` wires it, end to end through the seam: real
Postgres and Redis, the ``local`` driver starting simulated engine processes, the planner
loop off (every change here is a manual ScaleRole, so what happens is what the test asked).

``tideserve apply -f deploy/examples/aggregated.yaml`` (the CLI as a process) starts the
spec's 2 workers; ScaleRole 2 -> 3 -> 1: the instances appear in and leave ListInstances,
membership events reach ``{prefix}:membership`` (ADDED once ready; DRAINING then REMOVED for
each victim), and ``tideserve describe deployment --json`` shows desired vs actual and the
manual decisions."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc, common_pb2, events_pb2

from services.autoscaler.drivers.settings import DriverSettings, LocalSettings
from services.autoscaler.settings import AutoscalerSettings
from services.common.streams import decode_entry
from tests.helpers.autoscale import autoscaler_service, tideserve
from tests.helpers.ports import free_ports, port_range
from tests.helpers.waits import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ME = events_pb2.MembershipEvent
AGG = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "aggregated.yaml"


def _settings(postgres_db_url: str, redis_url: str, tmp_path: Path) -> AutoscalerSettings:
    (port,) = free_ports(1)
    first, last = port_range(41)
    return AutoscalerSettings(
        grpc_port=port,
        metrics_port=0,
        postgres_url=postgres_db_url,
        redis_url=redis_url,
        stream_prefix=f"t{uuid.uuid4().hex[:8]}",
        planner_enabled=False,
        state_dir=tmp_path / "autoscaler",
        load_poll_s=0.2,
        driver=DriverSettings(
            kind="local", resync_s=0.5, retry_base_s=0.2, drain_timeout_s=10, drain_poll_s=0.05,
            local=LocalSettings(port_min=first, port_max=last,
                                state_dir=str(tmp_path / "engines"), probe_interval_s=0.05),
        ),
    )  # fmt: skip


async def _events(redis_url: str, stream: str) -> dict[str, list[tuple[int, int]]]:
    """instance -> [(kind, state)] of its membership events, in order."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    try:
        out: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for _id, fields in await client.xrange(stream):
            ev = decode_entry(fields, events_pb2.MembershipEvent)
            out[ev.instance.instance_id].append((ev.kind, ev.instance.state))
        return out
    finally:
        await client.aclose()


async def test_apply_and_scale_drive_local_engines_and_membership(
    postgres_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings = _settings(postgres_db_url, redis_url, tmp_path)
    stream = f"{settings.stream_prefix}:membership"
    async with autoscaler_service(settings) as address:
        code, out, err = await tideserve("apply", "-f", str(AGG), "--autoscaler", address)
        assert code == 0, err
        assert "deployment chat-agg configured (generation 1)" in out
        async with grpc.aio.insecure_channel(address) as channel:
            stub = autoscaler_pb2_grpc.AutoscalerServiceStub(channel)

            async def ready() -> set[str]:
                got = await stub.ListInstances(
                    autoscaler_pb2.ListInstancesRequest(deployment="chat-agg")
                )
                return {
                    i.instance_id
                    for i in got.instances
                    if i.state == common_pb2.INSTANCE_STATE_READY
                }

            async def exactly(n: int) -> bool:
                got = await stub.ListInstances(
                    autoscaler_pb2.ListInstancesRequest(deployment="chat-agg")
                )
                states = [i.state for i in got.instances]
                return states == [common_pb2.INSTANCE_STATE_READY] * n

            await eventually(lambda: exactly(2), within_s=90)
            first = await ready()
            listed = await stub.ListInstances(autoscaler_pb2.ListInstancesRequest())
            assert all(
                i.role == common_pb2.ROLE_WORKER
                and i.engine_kind == common_pb2.ENGINE_KIND_SIM
                and i.endpoint.url.startswith("http://127.0.0.1:")
                and i.labels["role_name"] == "worker"
                for i in listed.instances
            ), listed

            up = await stub.ScaleRole(
                autoscaler_pb2.ScaleRoleRequest(deployment="chat-agg", role="worker", replicas=3)
            )
            assert up.decision.status == "applied"
            await eventually(lambda: exactly(3), within_s=90)
            grown = await ready()
            assert first < grown

            down = await stub.ScaleRole(
                autoscaler_pb2.ScaleRoleRequest(deployment="chat-agg", role="worker", replicas=1)
            )
            assert down.decision.status == "applied" and len(down.decision.victims) == 2
            await eventually(lambda: exactly(1), within_s=90)
            assert await ready() == grown - set(down.decision.victims)

        code, out, err = await tideserve(
            "describe", "deployment", "chat-agg", "--json", "--autoscaler", address
        )
        assert code == 0, err
        doc = json.loads(out)
        (role,) = doc["roles"]
        assert (role["role"], role["desired"], role["ready"]) == ("worker", 1, 1)
        assert doc["progress"] == "converged"
        reasons = [d["reasons"][0] for d in doc["recent_decisions"]]
        assert reasons == ["manual: worker 3 -> 1", "manual: worker 2 -> 3"]

        events = await _events(redis_url, stream)
        assert set(events) == grown
        (survivor,) = grown - set(down.decision.victims)
        assert events[survivor] == [(ME.KIND_ADDED, common_pb2.INSTANCE_STATE_READY)]
        for victim in down.decision.victims:
            assert events[victim] == [
                (ME.KIND_ADDED, common_pb2.INSTANCE_STATE_READY),
                (ME.KIND_STATE_CHANGED, common_pb2.INSTANCE_STATE_DRAINING),
                (ME.KIND_REMOVED, common_pb2.INSTANCE_STATE_STOPPED),
            ]
    # the service stopped: the local driver stopped its last engine and said so
    events = await _events(redis_url, stream)
    assert events[survivor][-1] == (ME.KIND_REMOVED, common_pb2.INSTANCE_STATE_STOPPED)
