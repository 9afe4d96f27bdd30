"""Per-slice buckets of finished requests and the rule that spreads a record over them (pure).

A slice is deployment x role x SLO class x tenant (:class:`SliceKey`); a bucket is one slice
over ``bucket_ms`` (1 minute by default) of **finish** time (a record exists once the request
has finished; its partition in Postgres is keyed the same way). Arrivals are counted in the
bucket of their **arrival** time, so the arrival rate of a window is exact.

Roles (the rule): an aggregated record goes whole to role ``"worker"``. A disaggregated one
is split by phase: role ``"prefill"`` gets the queue, TTFT, KV-transfer and input-token
sketches and the cache/router figures; role ``"decode"`` gets the TPOT, end-to-end and
output-token sketches. Request-level counters (count, arrivals, errors, sheds, SLO counts,
token sums) are kept in both halves, so a prefill or decode slice on its own reads as the
whole traffic it served; a total over all roles counts them once (from the non-decode slices,
see :func:`services.telemetry.windows.stats.window_stats`).

Buckets merge exactly: counters and sums add, sketches merge (DDSketch, relative accuracy
:data:`RELATIVE_ACCURACY`: every quantile it returns is within 1% of a value of the data at
that rank), so buckets of several replicas and persisted rollups combine into the same
window one replica would have computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from ddsketch import DDSketch
from ddsketch.ddsketch import BaseDDSketch
from tideserve.v1 import events_pb2

from services.telemetry.windows.batch import add_values
from services.telemetry.windows.classes import SLOClass
from services.telemetry.windows.dense import Dense, dense_of, merge_dense, sketch_of

__all__ = [
    "COUNTERS",
    "DECODE_SKETCHES",
    "PREFILL_SKETCHES",
    "RELATIVE_ACCURACY",
    "SKETCHES",
    "Bucket",
    "BucketKey",
    "SliceKey",
    "Summary",
    "Tally",
    "add_records",
    "add_records_to",
    "align",
    "merge_summaries",
]

RELATIVE_ACCURACY = 0.01
"""DDSketch relative accuracy of every percentile (±1%)."""

PREFILL_SKETCHES = ("input_tokens", "queue_ms", "ttft_ms", "kv_transfer_ms")
DECODE_SKETCHES = ("output_tokens", "tpot_ms", "e2e_ms")
SKETCHES = PREFILL_SKETCHES + DECODE_SKETCHES

COUNTERS = (
    "count",
    "arrivals",
    "ok",
    "errors",
    "sheds",
    "input_tokens_sum",
    "output_tokens_sum",
    "prompt_tokens_sum",
    "cached_tokens_sum",
    "router_samples",
    "router_abs_error_sum",
    "ttft_met",
    "tpot_met",
    "slo_met",
)
"""Request-level counters (ints, or float sums), in the rollup encoding's order."""

_OK = events_pb2.REQUEST_OUTCOME_OK
_SHED = events_pb2.REQUEST_OUTCOME_SHED
_ERRORS = frozenset({events_pb2.REQUEST_OUTCOME_TIMEOUT, events_pb2.REQUEST_OUTCOME_UPSTREAM_ERROR})


class SliceKey(NamedTuple):
    deployment: str
    role: str
    slo_class: str
    tenant: str


BucketKey = tuple[SliceKey, int]
"""A slice and its bucket's start (ms, aligned to the bucket length)."""


def align(ts_ms: int, bucket_ms: int) -> int:
    """Start of the bucket holding ``ts_ms``."""
    return ts_ms - ts_ms % bucket_ms


def new_sketch() -> DDSketch:
    return DDSketch(relative_accuracy=RELATIVE_ACCURACY)


@dataclass
class Tally:
    """The request-level counters of a slice over some time. ``count`` = records that
    finished (any outcome); ``arrivals`` = records of the slice that arrived in it;
    ``ok``/``errors``/``sheds`` split ``count`` by outcome (errors = timeout or upstream
    failure; client errors and cancellations are neither). Sums and cache/router figures come
    from successful records only; ``ttft_met``/``tpot_met``/``slo_met`` count successful
    records meeting their class's TTFT, TPOT, and both targets (a target of 0 is always met)."""

    count: int = 0
    arrivals: int = 0
    ok: int = 0
    errors: int = 0
    sheds: int = 0
    input_tokens_sum: float = 0.0
    output_tokens_sum: float = 0.0
    prompt_tokens_sum: float = 0.0
    cached_tokens_sum: float = 0.0
    router_samples: int = 0
    router_abs_error_sum: float = 0.0
    ttft_met: int = 0
    tpot_met: int = 0
    slo_met: int = 0

    def add_counters(self, other: Tally) -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Bucket(Tally):
    """One slice over one bucket, as ingest fills it: counters and ``ddsketch`` sketches of
    the successful records. ``version`` changes whenever records are added (caches of its
    query form key on it)."""

    sketches: dict[str, BaseDDSketch] = field(default_factory=dict)
    version: int = 0

    def sketch(self, name: str) -> BaseDDSketch:
        sk = self.sketches.get(name)
        if sk is None:
            sk = self.sketches[name] = new_sketch()
        return sk

    def merge(self, other: Bucket, *, counters: bool = True) -> None:
        """Add ``other`` into this bucket (sketches always; counters unless told not to)."""
        if counters:
            self.add_counters(other)
        for name, sk in other.sketches.items():
            if sk.count:
                self.sketch(name).merge(sk)
        self.version += 1

    def copy(self) -> Bucket:
        out = Bucket()
        out.merge(self)
        return out

    def summary(self) -> Summary:
        """The query form of this bucket."""
        return Summary(
            np.array([getattr(self, n) for n in COUNTERS], dtype=np.float64),
            {n: dense_of(sk, RELATIVE_ACCURACY) for n, sk in self.sketches.items() if sk.count},
        )


_INT_COUNTERS = frozenset(n for n in COUNTERS if isinstance(getattr(Tally(), n), int))


@dataclass
class Summary:
    """A slice over a span, as queries merge it: the :data:`COUNTERS` as one float64 array
    (merging many is one vector sum) and :class:`Dense` sketches."""

    counters: np.ndarray[Any, np.dtype[np.float64]] = field(
        default_factory=lambda: np.zeros(len(COUNTERS))
    )
    sketches: dict[str, Dense] = field(default_factory=dict)

    def values(self) -> dict[str, float]:
        return dict(zip(COUNTERS, self.counters.tolist(), strict=True))

    def bucket(self) -> Bucket:
        """Back to the ingest form (memory reloaded from rollups)."""
        out = Bucket()
        for name, value in self.values().items():
            setattr(out, name, int(value) if name in _INT_COUNTERS else value)
        out.sketches = {n: sketch_of(d) for n, d in self.sketches.items()}
        return out


def merge_summaries(
    parts: Iterable[Summary], *, counters_of: Callable[[int], bool] | None = None
) -> Summary:
    """One summary of ``parts`` (``counters_of(i)`` False: take only part i's sketches)."""
    counted: list[np.ndarray[Any, np.dtype[np.float64]]] = []
    lists: dict[str, list[Dense]] = {}
    for i, p in enumerate(parts):
        if counters_of is None or counters_of(i):
            counted.append(p.counters)
        for n, d in p.sketches.items():
            lists.setdefault(n, []).append(d)
    total = np.add.reduce(counted) if counted else np.zeros(len(COUNTERS))
    return Summary(total, {n: merge_dense(ds) for n, ds in lists.items()})


def add_records(
    buckets: dict[BucketKey, Bucket],
    records: Iterable[events_pb2.RequestRecord],
    classes: Mapping[str, SLOClass],
    bucket_ms: int,
) -> None:
    """Add validated ``records`` into ``buckets`` (created as needed), by the module's rule."""

    def get(key: BucketKey) -> Bucket:
        b = buckets.get(key)
        if b is None:
            b = buckets[key] = Bucket()
        return b

    add_records_to(get, records, classes, bucket_ms)


def add_records_to(
    bucket: Callable[[BucketKey], Bucket],
    records: Iterable[events_pb2.RequestRecord],
    classes: Mapping[str, SLOClass],
    bucket_ms: int,
) -> None:
    """:func:`add_records` into whatever ``bucket(key)`` returns (get-or-create). The sketch
    values are gathered per (bucket, sketch) and added at the end in one
    :func:`~.batch.add_values` call (the same sketches as adding them one by one)."""
    cache: dict[tuple[str, str, str, str, int], tuple[Bucket, list[list[float]]]] = {}

    def get(raw: tuple[str, str, str, str, int]) -> tuple[Bucket, list[list[float]]]:
        """The bucket and its values gathered so far (one list per :data:`SKETCHES`)."""
        hit = cache.get(raw)
        if hit is None:
            dep, role, cls, tenant, start = raw
            b = bucket((SliceKey(dep, role, cls, tenant), start))
            b.version += 1
            hit = cache[raw] = (b, [[] for _ in SKETCHES])
        return hit

    for rec in records:
        finish = rec.finish_ms - rec.finish_ms % bucket_ms
        arrival = rec.arrival_ms - rec.arrival_ms % bucket_ms
        dep, cls_name, tenant = rec.deployment, rec.slo_class, rec.tenant
        cls = classes.get(cls_name)
        values = _values(rec) if rec.outcome == _OK else None
        for role, indexes in _ROLES[rec.disaggregated]:
            b, lists = get((dep, role, cls_name, tenant, finish))
            _add_counters(b, rec, cls)
            if arrival == finish:
                b.arrivals += 1
            else:
                get((dep, role, cls_name, tenant, arrival))[0].arrivals += 1
            if values is not None:
                for i in indexes:
                    v = values[i]
                    if v is not None:
                        lists[i].append(v)
    add_values(
        [
            (b.sketch(name), vs)
            for b, lists in cache.values()
            for name, vs in zip(SKETCHES, lists, strict=True)
            if vs
        ]
    )


_ROLES = {
    False: (("worker", tuple(range(len(SKETCHES)))),),
    True: (
        ("prefill", tuple(range(len(PREFILL_SKETCHES)))),
        ("decode", tuple(range(len(PREFILL_SKETCHES), len(SKETCHES)))),
    ),
}
"""Per role: the positions in :data:`SKETCHES` (and :func:`_values`) of its sketches."""


def _values(rec: events_pb2.RequestRecord) -> tuple[float | None, ...]:
    """What each of :data:`SKETCHES` gets from a successful record, in that order (None =
    nothing: TPOT of a single token, no KV transfer)."""
    return (
        rec.prompt_tokens,
        rec.queue_ms,
        rec.ttft_ms,
        rec.kv_transfer_ms if rec.kv_transfer_ms > 0 else None,
        rec.completion_tokens,
        rec.tpot_ms if rec.completion_tokens > 1 else None,
        rec.e2e_ms,
    )


def _add_counters(b: Bucket, rec: events_pb2.RequestRecord, cls: SLOClass | None) -> None:
    b.count += 1
    if rec.outcome == _SHED:
        b.sheds += 1
    elif rec.outcome in _ERRORS:
        b.errors += 1
    if rec.outcome != _OK:
        return
    b.ok += 1
    b.input_tokens_sum += rec.prompt_tokens
    b.output_tokens_sum += rec.completion_tokens
    b.prompt_tokens_sum += rec.prompt_tokens
    b.cached_tokens_sum += rec.cached_tokens
    b.router_samples += 1
    b.router_abs_error_sum += abs(rec.predicted_cached_tokens - rec.cached_tokens)
    ttft_ok = cls is None or cls.ttft_ms <= 0 or rec.ttft_ms <= cls.ttft_ms
    tpot_ok = cls is None or cls.tpot_ms <= 0 or rec.tpot_ms <= cls.tpot_ms
    b.ttft_met += ttft_ok
    b.tpot_met += tpot_ok
    b.slo_met += ttft_ok and tpot_ok
