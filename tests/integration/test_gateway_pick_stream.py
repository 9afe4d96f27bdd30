"""gRPC SchedulerService.PickStream over the shared core (in-process grpc.aio server on a
free port): one response per request in request order, refused requests answered with an
error status while the stream goes on, outcomes riding on later requests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tideserve.v1 import events_pb2, scheduler_pb2

from services.common.scheduling import LoadReport
from services.common.scheduling.service import GatewayCore
from services.scheduler.grpc.servicer import SchedulerServicer
from tests.helpers.scheduler import scheduler_stub, two_workers

LONG = " ".join(f"w{i}" for i in range(2000))
OK = events_pb2.REQUEST_OUTCOME_OK
Code = grpc.StatusCode


@pytest.fixture
async def stack() -> AsyncIterator[tuple[Any, GatewayCore]]:
    core = two_workers()
    async with scheduler_stub(SchedulerServicer(core, deployment="d", block_size=16)) as stub:
        yield stub, core


def req(**kw: Any) -> scheduler_pb2.PickRequest:
    kw.setdefault("deployment", "d")
    return scheduler_pb2.PickRequest(**kw)


async def _all(stub: Any, reqs: list[scheduler_pb2.PickRequest]) -> list[Any]:
    async def gen() -> AsyncIterator[scheduler_pb2.PickRequest]:
        for r in reqs:
            yield r

    return [r async for r in stub.PickStream(gen())]


def _code(resp: Any) -> Code | None:
    if not resp.HasField("error"):
        return None
    return next(c for c in Code if c.value[0] == resp.error.code)


@pytest.mark.parametrize(
    ("reqs", "want"),
    [
        ([req(prompt_text=LONG), req(prompt_text="a b")], [None, None]),
        (
            [req(prompt_text="a"), req(deployment=""), req(prompt_text="b")],
            [None, Code.INVALID_ARGUMENT, None],
        ),
        (
            [
                req(deployment="zz"),
                req(profile="nope"),
                req(slo_class="gold"),
                req(max_tokens=-1),
                req(deadline_ms=1),
                req(exclude_instances=["w1", "w2"]),
                req(prompt_text="ok"),
            ],
            [
                Code.NOT_FOUND,
                Code.NOT_FOUND,
                Code.NOT_FOUND,
                Code.INVALID_ARGUMENT,
                Code.INVALID_ARGUMENT,
                Code.UNAVAILABLE,
                None,
            ],
        ),
        ([], []),
    ],
    ids=["two-picks", "bad-in-the-middle", "every-refusal-then-ok", "empty-stream"],
)
async def test_one_response_per_request_in_order(
    stack: tuple[Any, GatewayCore], reqs: list[Any], want: list[Code | None]
) -> None:
    stub, _ = stack
    got = await _all(stub, reqs)
    assert [_code(r) for r in got] == want
    for r, w in zip(got, want, strict=True):
        if w is None:
            assert r.pick_id and r.decode.instance.instance_id in ("w1", "w2")
        else:
            assert not r.pick_id and not r.HasField("decode") and r.error.message


async def test_order_follows_requests_when_pipelined(stack: tuple[Any, GatewayCore]) -> None:
    """Requests written before any response is read are answered in order: each answer's
    prediction matches its own prompt (a growing prefix of one text, so the routed-prefix
    estimate rises with the position)."""
    stub, _ = stack
    call = stub.PickStream()
    words = LONG.split()
    sizes = [640, 1280, 1600, 1920]
    for n in sizes:
        await call.write(req(prompt_text=" ".join(words[:n]), max_tokens=4))
    await call.write(req(deployment="zz"))
    await call.done_writing()
    got = [r async for r in call]
    assert len(got) == 5 and _code(got[4]) == Code.NOT_FOUND
    # each prompt extends the previous one: its cached estimate is the previous prompt
    assert [r.predicted_cached_tokens for r in got[:4]] == [0, *sizes[:3]]
    assert len({r.pick_id for r in got[:4]}) == 4


async def test_resource_exhausted_carries_retry_hint(stack: tuple[Any, GatewayCore]) -> None:
    stub, core = stack
    for iid in ("w1", "w2"):
        core.fleet.report_load(iid, LoadReport(kv_usage=0.99), time.monotonic())
    # saturated: queued (as HTTP requests are) and refused when its deadline passes; the
    # stream answers in order, so the second is decided after the first was refused
    now_ms = int(time.time() * 1000)
    got = await _all(
        stub,
        [
            req(prompt_text="x", deadline_ms=now_ms + 300),
            req(prompt_text="y", deadline_ms=now_ms + 2000),
        ],
    )
    assert [_code(r) for r in got] == [Code.RESOURCE_EXHAUSTED] * 2
    assert got[0].error.retry_after_ms > 0
    assert f"retry_after_ms={got[0].error.retry_after_ms}" in got[0].error.message


async def test_tagged_request_is_not_held_up_by_one_waiting(
    stack: tuple[Any, GatewayCore],
) -> None:
    """A tagged request waiting in admission (saturated fleet) does not hold up the tagged
    one behind it: that one is answered first, each answer echoes its tag; untagged requests
    keep their order around them."""
    stub, core = stack
    for iid in ("w1", "w2"):
        core.fleet.report_load(iid, LoadReport(kv_usage=0.99), time.monotonic())
    now_ms = int(time.time() * 1000)
    got = await _all(
        stub,
        [
            req(prompt_text="x", deadline_ms=now_ms + 1500, tag="waits"),
            req(deployment="zz", tag="refused"),
            req(slo_class="gold"),
            req(deployment=""),
        ],
    )
    assert [(r.tag, _code(r)) for r in got] == [
        ("refused", Code.NOT_FOUND),
        ("", Code.NOT_FOUND),
        ("", Code.INVALID_ARGUMENT),
        ("waits", Code.RESOURCE_EXHAUSTED),
    ]


async def test_outcomes_ride_on_later_requests(stack: tuple[Any, GatewayCore]) -> None:
    stub, core = stack
    first = await stub.Pick(req(prompt_text=LONG))
    assert core.fleet.in_flight(first.decode.instance.instance_id) == 1
    outs = [
        scheduler_pb2.ReportOutcomeRequest(pick_id=first.pick_id, outcome=OK),
        scheduler_pb2.ReportOutcomeRequest(pick_id="unknown", outcome=OK),  # ignored
    ]
    got = await _all(stub, [req(prompt_text="a", report_outcomes=outs),
                            req(prompt_text="b", report_outcomes=outs[:1])])  # fmt: skip
    assert [_code(r) for r in got] == [None, None]
    assert core.fleet.in_flight(first.decode.instance.instance_id) == sum(
        1 for r in got if r.decode.instance.instance_id == first.decode.instance.instance_id
    )
    # already settled on the stream: the unary call stays idempotent
    await stub.ReportOutcome(scheduler_pb2.ReportOutcomeRequest(pick_id=first.pick_id))
    # outcomes are applied even when the request itself is refused
    second = got[0].pick_id
    refused = await _all(stub, [req(deployment="", report_outcomes=[
        scheduler_pb2.ReportOutcomeRequest(pick_id=second, outcome=OK)])])  # fmt: skip
    assert _code(refused[0]) == Code.INVALID_ARGUMENT
    listed = await stub.ListEndpoints(scheduler_pb2.ListEndpointsRequest(deployment="d"))
    assert sum(e.in_flight for e in listed.endpoints) == 1  # only "b" is still open
