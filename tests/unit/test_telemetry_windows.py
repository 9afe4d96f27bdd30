"""Telemetry's pure windows core: validation, buckets, window math, merge, rollup codec."""

from __future__ import annotations

import random
from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np
import pytest
from tideserve.v1 import events_pb2

from services.telemetry.store import partitions
from services.telemetry.windows.bucket import (
    RELATIVE_ACCURACY,
    Bucket,
    BucketKey,
    SliceKey,
    Summary,
    add_records,
)
from services.telemetry.windows.classes import SLOClass
from services.telemetry.windows.codec import CodecError, decode_bucket, encode_bucket
from services.telemetry.windows.memory import WindowMemory, split_window
from services.telemetry.windows.stats import Filters, merge_slices, window_bounds, window_stats
from services.telemetry.windows.validate import ValidationRules, validate
from tests.helpers.records import NOW_MS, record

MIN = 60_000
CLASSES = {
    "interactive": SLOClass("interactive", 90.0, 200.0, 30.0),
    "batch": SLOClass("batch", 50.0, 0.0, 0.0),
}
RULES = ValidationRules(frozenset({"llama", "qwen"}), max_skew_ms=60_000, max_age_ms=86_400_000)

# ----------------------------------------------------------------------------- validate

VALIDATION = [
    ("ok", {}, None),
    (
        "ok-shed-without-ttft",
        {"outcome": events_pb2.REQUEST_OUTCOME_SHED, "ttft_ms": 0, "e2e_ms": 0},
        None,
    ),
    ("empty-id", {"request_id": ""}, "empty_request_id"),
    ("unknown-deployment", {"deployment": "mistral"}, "unknown_deployment"),
    ("empty-deployment", {"deployment": ""}, "unknown_deployment"),
    ("no-arrival", {"arrival_ms": 0}, "missing_timing"),
    ("no-finish", {"finish_ms": 0, "arrival_ms": 1}, "missing_timing"),
    ("ok-without-ttft", {"ttft_ms": 0}, "missing_timing"),
    ("nan-tpot", {"tpot_ms": float("nan")}, "missing_timing"),
    ("negative-queue", {"queue_ms": -1.0}, "negative_timing"),
    ("negative-kv-transfer", {"kv_transfer_ms": -0.5}, "negative_timing"),
    ("negative-tokens", {"cached_tokens": -3}, "negative_timing"),
    (
        "finish-before-arrival",
        {"arrival_ms": NOW_MS, "finish_ms": NOW_MS - 5},
        "finish_before_arrival",
    ),
    ("future", {"finish_ms": NOW_MS + 61_000, "arrival_ms": NOW_MS}, "future"),
    ("within-skew", {"finish_ms": NOW_MS + 59_000, "arrival_ms": NOW_MS}, None),
    ("too-old", {"finish_ms": NOW_MS - 86_400_001, "arrival_ms": NOW_MS - 86_500_000}, "too_old"),
    ("nul-in-tenant", {"tenant": "a\x00b"}, "nul_in_text"),
    ("nul-in-a-score", {"scores": [events_pb2.PluginScore(plugin="p\x00")]}, "nul_in_text"),
]


@pytest.mark.parametrize(
    ("fields", "code"), [c[1:] for c in VALIDATION], ids=[c[0] for c in VALIDATION]
)
def test_validate(fields: dict[str, Any], code: str | None) -> None:
    rid = fields.pop("request_id", "r1")
    why = validate(record(rid, **fields), RULES, NOW_MS)
    assert (why.code if why else None) == code


FIELDS = (
    "queue_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "kv_transfer_ms",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "predicted_cached_tokens",
)


@pytest.mark.parametrize("field", FIELDS, ids=FIELDS)
def test_validate_names_the_negative_or_infinite_field(field: str) -> None:
    shed = events_pb2.REQUEST_OUTCOME_SHED  # a failed request may lack TTFT and e2e
    why = validate(record("r1", outcome=shed, **{field: -1}), RULES, NOW_MS)
    assert why is not None and (why.code, why.detail) == ("negative_timing", f"{field} is negative")
    if field.endswith("_ms"):
        why = validate(record("r1", outcome=shed, **{field: float("inf")}), RULES, NOW_MS)
        assert why is not None
        assert (why.code, why.detail) == ("missing_timing", f"{field} is not a finite number")


def test_empty_known_deployments_accept_any_name() -> None:
    assert validate(record(deployment="anything"), ValidationRules(), NOW_MS) is None


def test_rejection_line_names_request_and_reason() -> None:
    why = validate(record("abc", deployment="x"), RULES, NOW_MS)
    assert why is not None and why.line("abc").startswith("abc: unknown_deployment: ")


# ----------------------------------------------------------------------------- buckets


def buckets_of(records: list[events_pb2.RequestRecord]) -> dict[BucketKey, Bucket]:
    out: dict[BucketKey, Bucket] = {}
    add_records(out, records, CLASSES, MIN)
    return out


def query(
    buckets: Mapping[BucketKey, Bucket | Summary],
    window_s: float = 300,
    end: int = NOW_MS,
    **filters: str,
) -> Any:
    f = Filters(**filters)
    start, end = window_bounds(end, window_s, MIN)
    rows = [(k, b if isinstance(b, Summary) else b.summary()) for k, b in buckets.items()]
    return window_stats(merge_slices(rows, start, end, f), start, end, f, CLASSES)


def test_disaggregated_record_splits_by_phase_and_total_counts_it_once() -> None:
    recs = [
        record("p1", disaggregated=True, kv_transfer_ms=8.0),
        record("a1"),
    ]
    total, slices = query(buckets_of(recs))
    by_role = {s.role: s for s in slices}
    assert set(by_role) == {"prefill", "decode", "worker"}
    assert by_role["prefill"].ttft_ms.p50 > 0 and by_role["prefill"].tpot_ms.p50 == 0
    assert by_role["decode"].tpot_ms.p50 > 0 and by_role["decode"].ttft_ms.p50 == 0
    assert by_role["prefill"].kv_transfer_ms.p50 == pytest.approx(8.0, rel=RELATIVE_ACCURACY)
    assert by_role["decode"].requests == by_role["prefill"].requests == 1
    assert total.requests == 2  # the decode half repeats its prefill twin's counters
    decode_only, _ = query(buckets_of(recs), role="decode")
    assert decode_only.requests == 1


OUTCOMES = [
    ("ok", events_pb2.REQUEST_OUTCOME_OK, (0.0, 0.0)),
    ("shed", events_pb2.REQUEST_OUTCOME_SHED, (0.0, 0.5)),
    ("timeout", events_pb2.REQUEST_OUTCOME_TIMEOUT, (0.5, 0.0)),
    ("upstream", events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR, (0.5, 0.0)),
    ("client-error", events_pb2.REQUEST_OUTCOME_CLIENT_ERROR, (0.0, 0.0)),
]


@pytest.mark.parametrize(
    ("outcome", "rates"), [c[1:] for c in OUTCOMES], ids=[c[0] for c in OUTCOMES]
)
def test_error_and_shed_rates(outcome: int, rates: tuple[float, float]) -> None:
    total, _ = query(buckets_of([record("a"), record("b", outcome=outcome)]))
    assert (total.error_rate, total.shed_rate) == rates


def test_cache_router_error_and_slo_attainment() -> None:
    recs = [
        record("a", ttft_ms=150.0, tpot_ms=20.0),  # meets both
        record("b", ttft_ms=250.0, tpot_ms=20.0),  # misses TTFT
        record("c", ttft_ms=150.0, tpot_ms=40.0),  # misses TPOT
        record("d", slo_class="batch", ttft_ms=9000.0, tpot_ms=90.0),  # no targets
    ]
    total, _ = query(buckets_of(recs), window_s=60)
    assert total.cache_hit_ratio == pytest.approx(0.6)
    assert total.cached_tokens_abs_error == pytest.approx(100.0)
    assert total.cached_tokens_error_ratio == pytest.approx(0.1)
    assert total.slo_attainment == pytest.approx(0.5)
    classes = {c.slo_class: c for c in total.classes}
    assert classes["interactive"].ttft_attainment == pytest.approx(2 / 3)
    assert classes["interactive"].tpot_attainment == pytest.approx(2 / 3)
    assert not classes["interactive"].met
    assert classes["batch"].met
    # goodput: requests meeting both targets per second of the window (60 s here)
    assert total.goodput_rps == pytest.approx(
        2 / ((NOW_MS - window_bounds(NOW_MS, 60, MIN)[0]) / 1000)
    )


def test_arrivals_count_in_their_own_bucket() -> None:
    # finishes in the current minute, arrived three minutes earlier
    rec = record("a", arrival_ms=NOW_MS - 3 * MIN, e2e_ms=3 * MIN)
    buckets = buckets_of([rec])
    arrivals = {start: b.arrivals for (_k, start), b in buckets.items()}
    counts = {start: b.count for (_k, start), b in buckets.items()}
    finish, arrival = NOW_MS - NOW_MS % MIN, (NOW_MS - 3 * MIN) - (NOW_MS - 3 * MIN) % MIN
    assert arrivals == {finish: 0, arrival: 1} and counts == {finish: 1, arrival: 0}


def test_window_bounds_cover_whole_buckets() -> None:
    start, end = window_bounds(NOW_MS, 300, MIN)
    assert start % MIN == 0 and start <= NOW_MS - 300_000 < start + MIN and end == NOW_MS
    with pytest.raises(ValueError, match="window_s"):
        window_bounds(NOW_MS, 0, MIN)


# ----------------------------------------------------------------------------- accuracy


def traffic(n: int, seed: int) -> list[events_pb2.RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        finish = NOW_MS - rng.randrange(0, 5 * MIN)
        ttft = rng.lognormvariate(5.0, 1.0)
        out.append(
            record(
                f"r{seed}-{i}",
                finish_ms=finish,
                arrival_ms=finish - 5000,
                ttft_ms=ttft,
                tpot_ms=rng.uniform(5, 80),
                e2e_ms=ttft + 4000,
                prompt_tokens=rng.choice([200, 8000]) + rng.randrange(100),
                completion_tokens=rng.randrange(2, 800),
                tenant=rng.choice(["acme", "beta"]),
                slo_class=rng.choice(["interactive", "batch"]),
            )
        )
    return out


@pytest.mark.parametrize("metric", ["ttft_ms", "tpot_ms", "input_tokens"], ids=str)
def test_window_percentiles_within_relative_accuracy_of_exact(metric: str) -> None:
    recs = traffic(5000, seed=7)
    total, _ = query(buckets_of(recs), window_s=400)
    field = {"input_tokens": "prompt_tokens"}.get(metric, metric)
    values = np.array([getattr(r, field) for r in recs], dtype=float)
    got = getattr(total, metric)
    for q, value in ((0.5, got.p50), (0.9, got.p90), (0.99, got.p99)):
        lo = np.quantile(values, q, method="lower")
        hi = np.quantile(values, q, method="higher")
        assert lo * (1 - RELATIVE_ACCURACY) <= value <= hi * (1 + RELATIVE_ACCURACY), (
            q,
            value,
            lo,
            hi,
        )
    assert got.mean == pytest.approx(values.mean(), rel=1e-9)


def test_two_replicas_buckets_merge_to_one_replicas() -> None:
    recs = traffic(3000, seed=11)
    one = query(buckets_of(recs))
    a, b = buckets_of(recs[::2]), buckets_of(recs[1::2])
    start, end = window_bounds(NOW_MS, 300, MIN)
    f = Filters()
    rows = [(k, v.summary()) for k, v in chain(a.items(), b.items())]
    merged = merge_slices(rows, start, end, f)
    two = window_stats(merged, start, end, f, CLASSES)
    assert _rounded(two) == _rounded(one)


def _rounded(x: Any) -> Any:
    """Stats with float sums rounded (sums added in another order differ in the last bits;
    counts and sketch quantiles must be identical)."""
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, tuple | list):
        return [_rounded(v) for v in x]
    if hasattr(x, "__dataclass_fields__"):
        return {k: _rounded(getattr(x, k)) for k in x.__dataclass_fields__}
    return x


# ----------------------------------------------------------------------------- codec


def test_rollup_codec_round_trips_exactly() -> None:
    buckets = buckets_of(
        [*traffic(2000, seed=3), record("pd", disaggregated=True, kv_transfer_ms=3.0)]
    )
    decoded = {}
    for key, b in buckets.items():
        data = encode_bucket(b, RELATIVE_ACCURACY)
        back, accuracy = decode_bucket(data)
        assert accuracy == RELATIVE_ACCURACY
        assert encode_bucket(back, accuracy) == data  # the query form re-encodes identically
        decoded[key] = back
    assert query(decoded) == query(buckets)
    rebuilt = {k: v.bucket() for k, v in decoded.items()}  # the ingest form, for reloads
    assert query(rebuilt) == query(buckets)


@pytest.mark.parametrize(
    "data",
    [b"", b"XXXX" + bytes(200), b"TSB2" + bytes(10)],
    ids=["empty", "bad-magic", "truncated"],
)
def test_codec_rejects_garbage(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode_bucket(data)


def test_codec_rejects_trailing_bytes() -> None:
    data = encode_bucket(
        buckets_of([record()])[next(iter(buckets_of([record()])))], RELATIVE_ACCURACY
    )
    with pytest.raises(CodecError, match="trailing"):
        decode_bucket(data + b"x")


# ----------------------------------------------------------------------------- memory, partitions


def test_memory_holds_buckets_from_its_floor_and_evicts_older() -> None:
    mem = WindowMemory(MIN, 5 * MIN)
    key = SliceKey("llama", "worker", "interactive", "acme")
    old, new = (key, mem.floor(NOW_MS) - MIN), (key, mem.floor(NOW_MS))
    assert not mem.held(old, NOW_MS) and mem.held(new, NOW_MS)
    mem.bucket(new).count += 2
    mem.replace([(old, Bucket(count=1))])
    assert [k for k, _ in mem.items()] == [new, old]
    first = mem.summaries(0, NOW_MS + MIN)
    assert mem.summaries(0, NOW_MS + MIN)[0][1] is first[0][1]  # cached while unchanged
    mem.bucket(new).version += 1
    assert mem.summaries(0, NOW_MS + MIN)[0][1] is not first[0][1]
    assert mem.evict(NOW_MS) == 1 and len(mem) == 1
    assert mem.evict(NOW_MS + 10 * MIN) == 1 and len(mem) == 0


SPLITS = [
    ("all-memory", (100, 200), 50, ((100, 200), (100, 50))),
    ("all-rollups", (100, 200), 300, ((300, 200), (100, 200))),
    ("straddle", (100, 200), 150, ((150, 200), (100, 150))),
]


@pytest.mark.parametrize(
    ("rng", "floor", "want"), [c[1:] for c in SPLITS], ids=[c[0] for c in SPLITS]
)
def test_split_window(rng: tuple[int, int], floor: int, want: Any) -> None:
    assert split_window(*rng, floor) == want


def test_partitions_needed_and_droppable() -> None:
    day = 86_400_000
    now = 10 * day + 5
    assert partitions.needed(now, day, 2 * day, 2) == [
        8 * day,
        9 * day,
        10 * day,
        11 * day,
        12 * day,
    ]
    assert partitions.droppable([6 * day, 7 * day, 8 * day, 10 * day], now, day, 2 * day) == [
        6 * day,
        7 * day,
    ]
    assert partitions.parse_name(partitions.partition_name(8 * day)) == 8 * day
    assert partitions.parse_name("request_records") is None


def test_dense_sketches_answer_exactly_as_ddsketch() -> None:
    from ddsketch import DDSketch

    from services.telemetry.windows.dense import dense_of, merge_dense, sketch_of

    rng = random.Random(5)
    a, b = DDSketch(RELATIVE_ACCURACY), DDSketch(RELATIVE_ACCURACY)
    for i in range(4000):
        (a if i % 2 else b).add(0.0 if i % 9 == 0 else rng.lognormvariate(4, 1.5))
    merged = merge_dense([dense_of(a, RELATIVE_ACCURACY), dense_of(b, RELATIVE_ACCURACY)])
    a.merge(b)
    qs = (0.0, 0.05, 0.5, 0.9, 0.99, 1.0)
    assert merged.quantiles(qs) == [a.get_quantile_value(q) for q in qs]
    assert [merged.get_quantile_value(q) for q in qs] == [a.get_quantile_value(q) for q in qs]
    back = sketch_of(merged)
    assert [back.get_quantile_value(q) for q in qs] == [a.get_quantile_value(q) for q in qs]
    assert (back.count, back.sum) == (a.count, a.sum)


def _proto_dense(sk: Any) -> tuple[object, ...]:
    """What ddsketch's own protobuf form says of a sketch: (first key, bins, zero count)."""
    from ddsketch.pb.proto import DDSketchProto

    pos = DDSketchProto.to_proto(sk).positiveValues
    bins = list(pos.contiguousBinCounts)
    nz = [i for i, c in enumerate(bins) if c]
    first = nz[0] if nz else 0
    return (
        (pos.contiguousBinIndexOffset + first) if nz else 0,
        bins[first : nz[-1] + 1] if nz else [],
        DDSketchProto.to_proto(sk).zeroCount,
    )


DENSE_SOURCES = [
    ("empty", []),
    ("zeros_only", [0.0, 0.0]),
    ("latencies_and_zeros", [0.0 if i % 7 == 0 else 1.5**i for i in range(-20, 40)]),
    ("one_value", [250.0]),
]


@pytest.mark.parametrize("values", [v for _, v in DENSE_SOURCES], ids=[n for n, _ in DENSE_SOURCES])
def test_dense_of_reads_the_bins_ddsketchs_protobuf_form_carries(values: list[float]) -> None:
    from ddsketch import DDSketch

    from services.telemetry.windows.dense import dense_of, sketch_of

    sk = DDSketch(RELATIVE_ACCURACY)
    for v in values:
        sk.add(v)
    for source in (sk, sketch_of(dense_of(sk, RELATIVE_ACCURACY))):
        d = dense_of(source, RELATIVE_ACCURACY)
        assert (d.offset if d.bins.size else 0, d.bins.tolist(), d.zero) == _proto_dense(source)
        assert (d.count, d.sum) == (sk.count, sk.sum)
