"""Request records for decisions served over gRPC (``Pick``/``PickStream`` + ``ReportOutcome``).

The HTTP gateway sees a request from its first byte to its last and records it itself
(one :class:`~services.scheduler.core.records.RequestContext` per request). A platform that only asks for a decision carries
the request on its own data path; what it reports back (``ReportOutcomeRequest`` or
``PickRequest.report_outcomes``) completes the record: the decision and why (endpoints,
plugin scores, predicted cached tokens and TTFT) from the pick, the outcome, tokens and
latencies from the report. Pure: times are passed in.

Contract: one record per pick id, built when its first outcome arrives (a repeated report of
the same pick is idempotent and builds nothing); a pick that is never reported produces no
record (the core's reservation TTL releases its load).
"""

from __future__ import annotations

from dataclasses import dataclass

from tideserve.v1 import events_pb2, scheduler_pb2

from services.common.routing.types import Pick
from services.scheduler.core.records import fill_decision

__all__ = ["PickMemo", "record_from_report"]


@dataclass(frozen=True, slots=True)
class PickMemo:
    """What a pick must remember until its outcome arrives."""

    decision: Pick
    tenant: str
    slo_class: str
    session_id: str
    prompt_tokens: int
    arrival_wall: float
    """Wall-clock seconds when the Pick arrived."""
    trace_id: str = ""
    """From the Pick's ``traceparent`` (32 hex chars), "" without a valid one."""
    queue_ms: float = 0.0
    """Arrival → admitted (prefix lookup and the wait in the admission queue)."""


def record_from_report(
    pick_id: str,
    memo: PickMemo,
    report: scheduler_pb2.ReportOutcomeRequest,
    *,
    deployment: str,
    replica_id: str,
    finish_wall: float,
) -> events_pb2.RequestRecord:
    """The record of a gRPC-served decision once its outcome is known.

    ``request_id`` is the pick id; ``trace_id`` is the one of the Pick's ``traceparent``
    (the caller's trace), else empty; ``queue_ms`` is the Pick's intake (lookup and admission wait);
    prompt tokens are the reported ones, else those the pick was asked with.
    """
    rec = events_pb2.RequestRecord(
        request_id=pick_id,
        trace_id=memo.trace_id,
        deployment=deployment,
        tenant=memo.tenant,
        slo_class=memo.slo_class,
        session_id=memo.session_id,
        queue_ms=memo.queue_ms,
        prompt_tokens=report.prompt_tokens or memo.prompt_tokens,
        completion_tokens=report.completion_tokens,
        cached_tokens=report.cached_tokens,
        ttft_ms=report.ttft_ms,
        tpot_ms=report.tpot_ms,
        e2e_ms=report.e2e_ms,
        outcome=report.outcome,
        arrival_ms=int(memo.arrival_wall * 1000),
        finish_ms=int(finish_wall * 1000),
        replica_id=replica_id,
        source="grpc",
    )
    fill_decision(rec, memo.decision)
    return rec
