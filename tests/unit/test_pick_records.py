"""Records of gRPC-served decisions: the pick's decision plus the caller's reported outcome."""

from __future__ import annotations

import pytest
from tideserve.v1 import events_pb2, scheduler_pb2

from services.common.routing.types import Choice, EndpointView, Pick
from services.scheduler.core.pick_records import PickMemo, record_from_report

AGG = Pick(
    decode=Choice(EndpointView("w1"), 3.0, (("ttft", 0.75, 4.0),)),
    prefill=None,
    profile="default",
    predicted_cached_tokens=128,
    predicted_ttft_ms=40.0,
)
PD = Pick(
    decode=Choice(EndpointView("d1"), 1.0, (("load", 1.0, 1.0),)),
    prefill=Choice(EndpointView("p1"), 2.0, (("ttft", 0.5, 4.0),)),
    profile="default",
)


def memo(pick: Pick, prompt_tokens: int = 500) -> PickMemo:
    return PickMemo(
        decision=pick,
        tenant="acme",
        slo_class="agent",
        session_id="s1",
        prompt_tokens=prompt_tokens,
        arrival_wall=1000.0,
    )


@pytest.mark.parametrize(
    ("pick", "report", "expected"),
    [
        (
            AGG,
            scheduler_pb2.ReportOutcomeRequest(
                outcome=events_pb2.REQUEST_OUTCOME_OK,
                prompt_tokens=512,
                completion_tokens=20,
                cached_tokens=128,
                ttft_ms=55.0,
                tpot_ms=9.0,
                e2e_ms=230.0,
            ),
            {
                "decode_instance": "w1",
                "prefill_instance": "",
                "disaggregated": False,
                "prompt_tokens": 512,
                "cached_tokens": 128,
                "predicted_cached_tokens": 128,
                "ttft_ms": 55.0,
                "outcome": events_pb2.REQUEST_OUTCOME_OK,
            },
        ),
        (
            PD,
            scheduler_pb2.ReportOutcomeRequest(outcome=events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR),
            {
                "decode_instance": "d1",
                "prefill_instance": "p1",
                "disaggregated": True,
                "prompt_tokens": 500,  # not reported: what the pick was asked with
                "cached_tokens": 0,
                "predicted_cached_tokens": 0,
                "ttft_ms": 0.0,
                "outcome": events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR,
            },
        ),
    ],
    ids=["aggregated-ok", "disaggregated-upstream-error"],
)
def test_record_from_report(
    pick: Pick, report: scheduler_pb2.ReportOutcomeRequest, expected: dict[str, object]
) -> None:
    r = record_from_report(
        "pick-1", memo(pick), report, deployment="dep", replica_id="gw-1", finish_wall=1000.25
    )
    got = {k: getattr(r, k) for k in expected}
    assert got == expected
    assert (r.request_id, r.deployment, r.replica_id, r.source) == ("pick-1", "dep", "gw-1", "grpc")
    assert (r.tenant, r.slo_class, r.session_id) == ("acme", "agent", "s1")
    assert (r.arrival_ms, r.finish_ms) == (1_000_000, 1_000_250)
    prefix = ["prefill/ttft"] if pick.prefill else []
    assert [s.plugin for s in r.scores] == [n for n, _, _ in pick.decode.scores] + prefix
