"""gRPC SchedulerService over the shared core (in-process grpc.aio server, free port)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tideserve.v1 import events_pb2, scheduler_pb2

from services.common.admission import QueueConfig
from services.common.scheduling import EndpointSpec, LoadReport, build_core
from services.common.scheduling.service import GatewayCore
from services.scheduler.grpc.servicer import SchedulerServicer
from tests.helpers.engines import until
from tests.helpers.scheduler import scheduler_stub, two_workers

LONG = " ".join(f"w{i}" for i in range(2000))


@pytest.fixture
async def stack() -> AsyncIterator[tuple[Any, GatewayCore]]:
    core = two_workers()
    async with scheduler_stub(SchedulerServicer(core, deployment="d", block_size=16)) as stub:
        yield stub, core


async def test_pick_report_list(stack: tuple[Any, GatewayCore]) -> None:
    stub, _ = stack
    resp = await stub.Pick(
        scheduler_pb2.PickRequest(deployment="d", prompt_text=LONG, max_tokens=8)
    )
    assert resp.pick_id and resp.decode.instance.instance_id in ("w1", "w2")
    assert not resp.disaggregated and resp.profile == "default" and resp.predicted_ttft_ms > 0
    assert {s.plugin for s in resp.decode.scores} >= {"ttft", "prefix"}
    listed = await stub.ListEndpoints(scheduler_pb2.ListEndpointsRequest(deployment="d"))
    assert sum(e.in_flight for e in listed.endpoints) == 1
    again = await stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text=LONG + " x"))
    assert again.decode.instance.instance_id == resp.decode.instance.instance_id
    assert again.predicted_cached_tokens >= 1984
    for pid in (resp.pick_id, resp.pick_id, again.pick_id):  # idempotent per pick_id
        await stub.ReportOutcome(
            scheduler_pb2.ReportOutcomeRequest(pick_id=pid, outcome=events_pb2.REQUEST_OUTCOME_OK)
        )
    listed = await stub.ListEndpoints(scheduler_pb2.ListEndpointsRequest())
    assert [e.in_flight for e in listed.endpoints] == [0, 0]
    assert [e.circuit for e in listed.endpoints] == ["closed", "closed"]


async def test_pd_pick_has_bootstrap() -> None:
    core = build_core(
        [
            EndpointSpec("p", "http://127.0.0.1:7001", role="prefill", bootstrap_port=8998),
            EndpointSpec("dec", "http://127.0.0.1:7002", role="decode"),
        ],
        perf_profile="test",
        block_size=16,
    )
    async with scheduler_stub(SchedulerServicer(core, deployment="d", block_size=16)) as stub:
        # `threshold`: a long prompt is disaggregated (the default decider would price it
        # against the idle decode engine, which computes it no slower)
        pick = scheduler_pb2.PickRequest(deployment="d", profile="threshold")
        pick.prompt_text = LONG
        resp = await stub.Pick(pick)
        pick.prompt_text = "hi"
        short = await stub.Pick(pick)
    assert resp.disaggregated and resp.prefill.instance.instance_id == "p"
    assert (resp.bootstrap_host, resp.bootstrap_port) == ("127.0.0.1", 8998) and resp.bootstrap_room
    assert not short.disaggregated and short.decode.instance.instance_id == "dec"


@pytest.mark.parametrize(
    ("req", "code"),
    [
        (scheduler_pb2.PickRequest(), grpc.StatusCode.INVALID_ARGUMENT),
        (scheduler_pb2.PickRequest(deployment="zz"), grpc.StatusCode.NOT_FOUND),
        (scheduler_pb2.PickRequest(deployment="d", profile="nope"), grpc.StatusCode.NOT_FOUND),
        (scheduler_pb2.PickRequest(deployment="d", slo_class="gold"), grpc.StatusCode.NOT_FOUND),
        (
            scheduler_pb2.PickRequest(deployment="d", max_tokens=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            scheduler_pb2.PickRequest(deployment="d", deadline_ms=1),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            scheduler_pb2.PickRequest(deployment="d", exclude_instances=["w1", "w2"]),
            grpc.StatusCode.UNAVAILABLE,
        ),
    ],
    ids=[
        "no-deployment",
        "unknown-deployment",
        "unknown-profile",
        "unknown-class",
        "negative",
        "past-deadline",
        "all-excluded",
    ],
)
async def test_pick_errors(stack: tuple[Any, GatewayCore], req: Any, code: grpc.StatusCode) -> None:
    stub, _ = stack
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Pick(req)
    assert info.value.code() == code and info.value.details()


async def test_slo_infeasible_and_saturation_are_resource_exhausted(
    stack: tuple[Any, GatewayCore],
) -> None:
    stub, core = stack
    for iid in ("w1", "w2"):
        core.fleet.report_load(iid, LoadReport(pending_prefill_tokens=10_000_000), time.monotonic())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Pick(
            scheduler_pb2.PickRequest(
                deployment="d", prompt_text=LONG, profile="slo", slo_class="interactive"
            )
        )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry_after_ms=" in (info.value.details() or "")
    assert dict(info.value.trailing_metadata() or ())["retry-after-ms"]
    for iid in ("w1", "w2"):
        core.fleet.report_load(iid, LoadReport(kv_usage=0.99), time.monotonic())
    # a saturated fleet queues the request (as HTTP does): refused once its deadline passes
    deadline = int(time.time() * 1000) + 300
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Pick(
            scheduler_pb2.PickRequest(deployment="d", prompt_text="x", deadline_ms=deadline)
        )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry_after_ms=" in (info.value.details() or "")
    assert not len(core.queue)


async def test_drain_undrain_and_unknowns(stack: tuple[Any, GatewayCore]) -> None:
    stub, _ = stack
    assert (await stub.Drain(scheduler_pb2.DrainRequest(instance_id="w1"))).in_flight == 0
    await stub.Drain(scheduler_pb2.DrainRequest(instance_id="w1"))  # idempotent
    for _ in range(3):
        r = await stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text="a b"))
        assert r.decode.instance.instance_id == "w2"
    listed = await stub.ListEndpoints(scheduler_pb2.ListEndpointsRequest(deployment="d"))
    assert [e.draining for e in listed.endpoints] == [True, False]
    await stub.Undrain(scheduler_pb2.UndrainRequest(instance_id="w1"))
    for call in (
        stub.Drain(scheduler_pb2.DrainRequest(instance_id="nope")),
        stub.Undrain(scheduler_pb2.UndrainRequest(instance_id="nope")),
        stub.ReportOutcome(scheduler_pb2.ReportOutcomeRequest(pick_id="nope")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_upstream_error_before_any_token_undoes_the_routed_prefix(
    stack: tuple[Any, GatewayCore],
) -> None:
    stub, _ = stack
    first = await stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text=LONG))
    await stub.ReportOutcome(
        scheduler_pb2.ReportOutcomeRequest(
            pick_id=first.pick_id, outcome=events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR
        )
    )
    again = await stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text=LONG))
    assert again.predicted_cached_tokens == 0  # the failed pick left no routed prefix


async def test_pick_waits_in_the_admission_queue_then_is_served() -> None:
    """A saturated fleet queues a Pick (as the HTTP gateway queues a request); freed
    capacity releases it and the call returns its decision."""
    core = two_workers()
    async with scheduler_stub(SchedulerServicer(core, deployment="d", block_size=16)) as stub:
        for iid in ("w1", "w2"):
            core.fleet.report_load(iid, LoadReport(kv_usage=0.99), time.monotonic())
        call = asyncio.ensure_future(
            stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text="a b c"))
        )
        await until(lambda: len(core.queue) == 1, "the Pick waits in the admission queue")
        assert not call.done()
        core.fleet.report_load("w2", LoadReport(kv_usage=0.1), time.monotonic())
        resp = await asyncio.wait_for(call, 10)
    assert resp.pick_id and resp.decode.instance.instance_id == "w2"
    assert not len(core.queue)


async def test_pick_shed_by_a_full_queue_is_resource_exhausted() -> None:
    core = build_core(
        [EndpointSpec("w1", "http://127.0.0.1:1", deployment="d")],
        perf_profile="test",
        block_size=16,
        queue=QueueConfig(max_total=1),
    )
    async with scheduler_stub(SchedulerServicer(core, deployment="d", block_size=16)) as stub:
        core.fleet.report_load("w1", LoadReport(kv_usage=0.99), time.monotonic())
        first = asyncio.ensure_future(
            stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text="a"))
        )
        await until(lambda: len(core.queue) == 1, "the first Pick is queued")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Pick(scheduler_pb2.PickRequest(deployment="d", prompt_text="b"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "overloaded" in (info.value.details() or "")
        retry = dict(info.value.trailing_metadata() or ())["retry-after-ms"]
        assert f"retry_after_ms={retry}" in (info.value.details() or "")
        first.cancel()
        await until(lambda: not len(core.queue), "a cancelled Pick leaves the queue")
