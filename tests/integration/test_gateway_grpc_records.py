"""Request records of gRPC-served decisions: a pick settled by ReportOutcome or by a later
PickStream request's ``report_outcomes`` produces one RequestRecord on the records stream
(real Redis), carrying the decision and the reported outcome; a repeated report adds none."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tideserve.v1 import events_pb2, scheduler_pb2

from services.common.streams import decode_entry
from services.scheduler.feeds.record_sink import RecordSink
from services.scheduler.grpc.servicer import SchedulerServicer
from tests.helpers.scheduler import scheduler_stub, two_workers

OK = events_pb2.REQUEST_OUTCOME_OK
ERR = events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR
PROMPT = " ".join(f"w{i}" for i in range(100))
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TP = f"00-{TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
async def grpc_stack(redis_client: Any) -> AsyncIterator[tuple[Any, RecordSink]]:
    sink = RecordSink(redis_client, f"ts:requests:{uuid.uuid4().hex[:6]}", flush_s=0.01)
    servicer = SchedulerServicer(
        two_workers(), deployment="d", block_size=16, records=sink.offer, replica_id="gw-a"
    )
    try:
        async with scheduler_stub(servicer) as stub:
            yield stub, sink
    finally:
        await sink.stop()


async def published(redis_client: Any, sink: RecordSink) -> list[events_pb2.RequestRecord]:
    await sink.flush()
    entries = await redis_client.xrange(sink.stream)
    return [decode_entry(f, events_pb2.RequestRecord) for _, f in entries]


def pick(**kw: Any) -> scheduler_pb2.PickRequest:
    kw.setdefault("deployment", "d")
    kw.setdefault("prompt_text", PROMPT)
    return scheduler_pb2.PickRequest(**kw)


async def test_report_outcome_publishes_one_record(
    grpc_stack: tuple[Any, RecordSink], redis_client: Any
) -> None:
    stub, sink = grpc_stack
    p = await stub.Pick(pick(tenant="t1", slo_class="agent", session_id="s9", traceparent=TP))
    assert await published(redis_client, sink) == []  # nothing until the outcome is known
    report = scheduler_pb2.ReportOutcomeRequest(
        pick_id=p.pick_id, outcome=OK, completion_tokens=7, cached_tokens=32, ttft_ms=41.5
    )
    await stub.ReportOutcome(report)
    await stub.ReportOutcome(report)  # idempotent: no second record
    (rec,) = await published(redis_client, sink)
    assert (rec.request_id, rec.source, rec.replica_id, rec.deployment) == (
        p.pick_id,
        "grpc",
        "gw-a",
        "d",
    )
    assert (rec.tenant, rec.slo_class, rec.session_id) == ("t1", "agent", "s9")
    assert rec.decode_instance == p.decode.instance.instance_id
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (100, 7, 32)
    assert rec.ttft_ms == 41.5 and rec.outcome == OK
    assert rec.trace_id == TRACE
    assert rec.predicted_cached_tokens == p.predicted_cached_tokens
    assert [s.plugin for s in rec.scores] == [s.plugin for s in p.decode.scores]


async def test_outcomes_on_the_stream_publish_records(
    grpc_stack: tuple[Any, RecordSink], redis_client: Any
) -> None:
    stub, sink = grpc_stack
    call = stub.PickStream()
    await call.write(pick(traceparent="not-a-traceparent"))
    first = await call.read()
    await call.write(
        pick(
            report_outcomes=[scheduler_pb2.ReportOutcomeRequest(pick_id=first.pick_id, outcome=ERR)]
        )
    )
    second = await call.read()
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    recs = await published(redis_client, sink)
    assert [(r.request_id, r.outcome, r.trace_id) for r in recs] == [(first.pick_id, ERR, "")]
    assert second.pick_id not in {r.request_id for r in recs}  # not reported yet
