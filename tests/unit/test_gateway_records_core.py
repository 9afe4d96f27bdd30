"""Request records, pure parts: W3C traceparent, usage extraction, outcomes, the record
built from a trace; kvmeta answer translation and which profiles need a lookup."""

from __future__ import annotations

import json

import pytest
from tideserve.v1 import common_pb2, events_pb2, kvmeta_pb2

from services.common.routing.types import Choice, EndpointView, Pick, PrefixMatch
from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.core.records import (
    RequestContext,
    Usage,
    build_record,
    outcome_for,
    parse_traceparent,
    usage_from_body,
    usage_from_sse,
)
from services.scheduler.feeds.kvmeta_client import precise_profiles, to_matches

T = "4bf92f3577b34da6a3ce929d0e0e4736"
S = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{T}-{S}-01", (T, S, "01")),
        (f"00-{T.upper()}-{S}-00", (T, S, "00")),
        (f"01-{T}-{S}-01-extra", (T, S, "01")),
        (f"00-{T}-{S}-01-extra", None),
        (f"ff-{T}-{S}-01", None),
        (f"00-{'0' * 32}-{S}-01", None),
        (f"00-{T}-{'0' * 16}-01", None),
        (f"00-{T[:-1]}-{S}-01", None),
        ("garbage", None),
        (None, None),
    ],
    ids=["valid", "upper", "future-version", "v00-extra", "version-ff", "zero-trace",
         "zero-span", "short", "garbage", "absent"],
)  # fmt: skip
def test_parse_traceparent(header: str | None, expected: tuple[str, str, str] | None) -> None:
    assert parse_traceparent(header) == expected


def sse(*objs: object) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"
    )


USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (sse({"choices": []}, {"choices": [], "usage": USAGE}), Usage(10, 3, 8)),
        (sse({"usage": {"prompt_tokens": 4, "completion_tokens": 1}}), Usage(4, 1, 0)),
        (sse({"text": "x", "meta_info": {"prompt_tokens": 5, "completion_tokens": 2,
                                         "cached_tokens": 4}}), Usage(5, 2, 4)),
        (sse({"usage": {**USAGE, "kv_transfer_ms": 2.5}}), Usage(10, 3, 8, 2.5)),
        (sse({"usage": {**USAGE, "kv_transfer_ms": "x"}}), Usage(10, 3, 8)),
        (sse({"meta_info": {"prompt_tokens": 5, "kv_transfer_ms": 1}}), Usage(5, 0, 0, 1.0)),
        (sse({"usage": {**USAGE, "kv_transfer_ms": 2.5, "kv_transfer_bytes": 4096}}),
         Usage(10, 3, 8, 2.5, 4096)),
        (sse({"usage": {**USAGE, "kv_transfer_bytes": -1, "kv_transfer_failed": "yes"}}),
         Usage(10, 3, 8)),
        (sse({"usage": {**USAGE, "kv_transfer_failed": True}}), Usage(10, 3, 8, 0.0, 0, True)),
        (sse({"choices": []}), None),
        (b'ge": {"prompt_tokens": 1}}\n\ndata: [DONE]\n\n', None),
        (b"", None),
    ],
    ids=[
        "openai-usage-chunk", "no-details", "sglang-meta", "kv-transfer-ms", "kv-transfer-ms-bad",
        "sglang-meta-kv-transfer-ms", "kv-transfer-bytes", "kv-transfer-bad-bytes-and-flag",
        "kv-transfer-failed", "no-usage", "cut-off", "empty",
    ],
)  # fmt: skip
def test_usage_from_sse(tail: bytes, expected: Usage | None) -> None:
    assert usage_from_sse(tail) == expected


def test_usage_from_body() -> None:
    assert usage_from_body(json.dumps({"usage": USAGE}).encode()) == Usage(10, 3, 8)
    assert usage_from_body(b"not json") is None
    assert usage_from_body(b"[1]") is None


@pytest.mark.parametrize(
    ("status", "error", "cancelled", "outcome"),
    [
        (200, "", False, events_pb2.REQUEST_OUTCOME_OK),
        (200, "stream broke", False, events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR),
        (200, "", True, events_pb2.REQUEST_OUTCOME_CANCELLED),
        (400, "", False, events_pb2.REQUEST_OUTCOME_CLIENT_ERROR),
        (413, "", False, events_pb2.REQUEST_OUTCOME_CLIENT_ERROR),
        (429, "", False, events_pb2.REQUEST_OUTCOME_SHED),
        (504, "", False, events_pb2.REQUEST_OUTCOME_TIMEOUT),
        (502, "", False, events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR),
        (503, "", False, events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR),
    ],
    ids=["ok", "broken-stream", "cancelled", "400", "413", "shed", "timeout", "502", "503"],
)
def test_outcome_for(status: int, error: str, cancelled: bool, outcome: int) -> None:
    assert outcome_for(status, error, cancelled) == outcome


def test_build_record_times_and_scores() -> None:
    pick = Pick(
        decode=Choice(EndpointView("d1"), 2.5, (("ttft", 0.5, 4.0), ("load", 0.5, 1.0))),
        prefill=Choice(EndpointView("p1"), 1.0, (("ttft", 1.0, 4.0),)),
        profile="default",
        predicted_cached_tokens=64,
        predicted_ttft_ms=12.5,
    )
    t = RequestContext(
        request_id="r",
        trace_id=T,
        arrival=10.0,
        arrival_wall=1000.0,
        parsed_at=10.001,
        admitted_at=10.011,
        pick=pick,
        retries=1,
        first_byte=10.1,
        streamed=True,
    )
    t.tail += sse({"usage": {"prompt_tokens": 100, "completion_tokens": 11,
                             "prompt_tokens_details": {"cached_tokens": 48},
                             "kv_transfer_ms": 3.5, "kv_transfer_bytes": 65536}})  # fmt: skip
    r = build_record(
        t, status=200, finish=10.6, finish_wall=1000.6, deployment="dep", replica_id="gw-2"
    )
    assert (r.replica_id, r.source) == ("gw-2", "http")
    assert (r.queue_ms, r.ttft_ms, r.e2e_ms) == pytest.approx((10.0, 100.0, 600.0))
    assert r.tpot_ms == pytest.approx(50.0)  # 500 ms over 10 tokens after the first
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (100, 11, 48)
    assert (r.kv_transfer_ms, r.kv_transfer_bytes, r.kv_transfer_failed) == (3.5, 65536, False)
    assert (r.predicted_cached_tokens, r.predicted_ttft_ms) == (64, 12.5)
    assert (r.decode_instance, r.prefill_instance, r.disaggregated) == ("d1", "p1", True)
    assert [(s.plugin, s.score, s.weight) for s in r.scores] == [
        ("ttft", 0.5, 4.0),
        ("load", 0.5, 1.0),
        ("prefill/ttft", 1.0, 4.0),
    ]
    assert (r.arrival_ms, r.finish_ms, r.retries) == (1_000_000, 1_000_600, 1)
    assert r.outcome == events_pb2.REQUEST_OUTCOME_OK and r.trace_id == T


def test_to_matches_translates_tiers() -> None:
    resp = kvmeta_pb2.MatchPrefixResponse(
        matches=[
            kvmeta_pb2.InstanceMatch(
                instance_id="a",
                matched_blocks=5,
                tiers=[
                    kvmeta_pb2.TierMatch(tier=common_pb2.TIER_GPU, blocks=3),
                    kvmeta_pb2.TierMatch(tier=common_pb2.TIER_SSD, blocks=2),
                    kvmeta_pb2.TierMatch(tier=common_pb2.TIER_UNSPECIFIED, blocks=9),
                ],
            ),
            kvmeta_pb2.InstanceMatch(instance_id="b", matched_blocks=0),
        ]
    )
    assert to_matches(resp) == {"a": PrefixMatch(5, {"gpu": 3, "ssd": 2})}


def test_precise_profiles_of_the_shipped_config() -> None:
    core = build_core([EndpointSpec("a", "http://a")], perf_profile="test")
    got = precise_profiles(core.scheduler)
    assert {"", "default", "agent", "slo", "default-prefill"} <= got
    assert not got & {"round_robin", "least_load", "power_of_two", "cache_aware"}
