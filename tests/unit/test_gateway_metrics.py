"""Gateway metrics, pure parts: observations from request traces, labels, scrape-time
collector over a core (no I/O)."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from tideserve.v1 import events_pb2

from services.common.admission import QueuedRequest
from services.common.scheduling import EndpointSpec, LoadReport, build_core
from services.scheduler.core.records import RequestContext
from services.scheduler.http.metrics import (
    GatewayMetrics,
    observe,
    outcome_name,
    upstream_kind,
)
from services.scheduler.http.openai import parse_request


def _sse_usage(completion: int) -> bytes:
    chunk = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": completion}}
    return f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()


def _trace(
    *,
    first: float | None = None,
    streamed: bool = False,
    tail: bytes = b"",
    parsed_at: float | None = None,
    admitted_at: float | None = None,
    slo: str = "",
    error: str = "",
    cancelled: bool = False,
) -> RequestContext:
    t = RequestContext("r", "0" * 31 + "1", arrival=10.0, arrival_wall=0.0)
    t.first_byte, t.streamed, t.tail = first, streamed, bytearray(tail)
    t.parsed_at, t.admitted_at = parsed_at, admitted_at
    t.error, t.cancelled = error, cancelled
    if slo:
        t.parsed = parse_request(
            "completion",
            json.dumps({"model": "m", "prompt": "a"}).encode(),
            {"X-Tideserve-Class": slo},
            models=(),
            classes=[slo],
        )
    return t


@pytest.mark.parametrize(
    ("trace", "status", "finish", "expected"),
    [
        (
            _trace(
                first=10.5, streamed=True, tail=_sse_usage(11), parsed_at=10.0, admitted_at=10.2
            ),
            200,
            11.5,
            ("ok", "agent", 0.2, 0.5, 0.1, 1.5),
        ),
        (_trace(first=10.25, slo="batch"), 200, 10.25, ("ok", "batch", None, 0.25, None, 0.25)),
        (
            _trace(first=10.1, streamed=True, tail=_sse_usage(1)),
            200,
            10.2,
            ("ok", "agent", None, 0.1, None, 0.2),
        ),
        (
            _trace(first=10.1, streamed=True, tail=b"data: {}\n\n"),
            200,
            10.2,
            ("ok", "agent", None, 0.1, None, 0.2),
        ),
        (_trace(), 400, 10.001, ("client_error", "agent", None, None, None, 0.001)),
        (_trace(parsed_at=10.0), 429, 10.3, ("shed", "agent", None, None, None, 0.3)),
        (
            _trace(first=10.1, streamed=True, error="broke"),
            200,
            10.4,
            ("upstream_error", "agent", None, 0.1, None, 0.4),
        ),
        (
            _trace(first=10.1, streamed=True, cancelled=True),
            200,
            10.2,
            ("cancelled", "agent", None, 0.1, None, 0.2),
        ),
        (_trace(cancelled=True), 499, 10.2, ("cancelled", "agent", None, None, None, 0.2)),
        (_trace(), 503, 10.5, ("upstream_error", "agent", None, None, None, 0.5)),
        (_trace(first=10.2), 404, 10.2, ("client_error", "agent", None, None, None, 0.2)),
    ],
    ids=[
        "streamed-all-figures",
        "whole-answer-named-class",
        "one-token-no-tpot",
        "no-usage-no-tpot",
        "bad-request",
        "shed-in-queue",
        "broken-stream",
        "client-gone-mid-stream",
        "client-gone-in-queue",
        "no-endpoint",
        "engine-4xx-no-ttft",
    ],
)
def test_observe(
    trace: RequestContext,
    status: int,
    finish: float,
    expected: tuple[str, str, float | None, float | None, float | None, float],
) -> None:
    o = observe(trace, status=status, finish=finish, default_class="agent")
    got = (o.outcome, o.slo_class, o.queue_s, o.ttft_s, o.tpot_s, o.e2e_s)
    for g, e in zip(got, expected, strict=True):
        assert g == e if e is None or isinstance(e, str) else g == pytest.approx(e)


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("connect: ClientConnectorError()", "connect"),
        ("HTTP 503: overloaded", "http_5xx"),
        ("read: ServerDisconnectedError()", "read"),
        ("prefill read: TimeoutError()", "prefill_read"),
        ("stream: ClientPayloadError()", "stream"),
        ("stream broken", "stream_broken"),
        ("empty stream", "empty_stream"),
        ("something new", "other"),
    ],
    ids=["connect", "5xx", "read", "prefill-read", "stream", "broken", "empty", "other"],
)
def test_upstream_kind(reason: str, kind: str) -> None:
    assert upstream_kind(reason) == kind


def test_outcome_names() -> None:
    assert outcome_name(events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR) == "upstream_error"
    assert outcome_name(events_pb2.REQUEST_OUTCOME_OK) == "ok"


def test_collector_exports_queue_depth_and_endpoint_state() -> None:
    core = build_core(
        [EndpointSpec("a", "http://a"), EndpointSpec("b", "http://b", "prefill")],
        perf_profile="test",
    )
    m = GatewayMetrics(CollectorRegistry())
    m.attach(core, lambda: 100.0)
    m.attach(core, lambda: 100.0)  # idempotent
    core.queue.offer(QueuedRequest("q1", slo_class="batch"), 100.0)
    core.fleet.reserve("p", ["a"], {}, 100.0)
    core.fleet.set_draining("b", True)
    for _ in range(3):
        core.fleet.upstream_result("a", False, 100.0)
    core.fleet.report_load("b", LoadReport(running=1), 99.0)
    stats = {"applied": 4, "unknown": 1}
    m.add_feed("load", lambda: stats)
    m.bad_request("invalid_json", None)
    m.shed_request("batch", "routing")
    m.upstream_failed("a", "connect: x", True)
    v = m.value
    assert v("tideserve_gateway_queue_depth", {"slo_class": "batch"}) == 1
    assert v("tideserve_gateway_queue_depth", {"slo_class": "interactive"}) == 0
    assert v("tideserve_gateway_endpoint_in_flight", {"instance": "a", "role": "worker"}) == 1
    assert v("tideserve_gateway_endpoint_draining", {"instance": "b"}) == 1
    assert v("tideserve_gateway_endpoint_circuit", {"instance": "a", "state": "open"}) == 1
    assert v("tideserve_gateway_endpoint_circuit", {"instance": "b", "state": "closed"}) == 1
    assert v("tideserve_gateway_endpoint_load_source", {"instance": "b", "source": "scrape"}) == 1
    assert v("tideserve_gateway_endpoint_load_source", {"instance": "a", "source": "none"}) == 1
    assert v("tideserve_gateway_feed_total", {"feed": "load", "event": "applied"}) == 4
    assert v("tideserve_gateway_bad_requests_total", {"reason": "invalid_json", "param": ""}) == 1
    assert v("tideserve_gateway_shed_total", {"slo_class": "batch", "where": "routing"}) == 1
    assert v("tideserve_gateway_retries_total") == 1
    assert v("tideserve_gateway_upstream_errors_total", {"instance": "a", "kind": "connect"}) == 1
    text = generate_latest(m.registry).decode()
    assert "tideserve_gateway_ttft_seconds" in text and "tideserve_grpc" not in text


def test_add_feed_needs_a_core() -> None:
    with pytest.raises(RuntimeError):
        GatewayMetrics().add_feed("x", dict)


def test_two_gateways_never_share_a_registry_by_default() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    a.retries.inc()
    assert a.registry is not b.registry and b.value("tideserve_gateway_retries_total") == 0
