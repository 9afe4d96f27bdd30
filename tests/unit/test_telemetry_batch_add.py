"""``windows.batch.add_values`` leaves sketches exactly as ``sk.add`` value by value would,
and ``add_records`` fills the same buckets whatever the batch."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from ddsketch import DDSketch
from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import CubicallyInterpolatedMapping, LogarithmicMapping
from ddsketch.store import DenseStore

from benchmarks._telemetry_data import records as bench_records
from services.telemetry.settings import TelemetrySettings
from services.telemetry.windows.batch import add_values
from services.telemetry.windows.bucket import (
    RELATIVE_ACCURACY,
    Bucket,
    BucketKey,
    add_records,
    new_sketch,
)
from services.telemetry.windows.codec import encode_bucket
from services.telemetry.windows.dense import dense_of, sketch_of

Values = list[float]


def _lognormal(seed: int, n: int, mu: float, sigma: float) -> Values:
    rng = random.Random(seed)
    return [rng.lognormvariate(mu, sigma) for _ in range(n)]


def _boundaries() -> Values:
    """Values on and one float either side of the mapping's bucket bounds (where a last-bit
    difference in log would move a value to the next key)."""
    m = LogarithmicMapping(RELATIVE_ACCURACY)
    out: Values = []
    for key in range(-50, 900, 7):
        edge = m._pow_gamma(key)  # log_gamma(edge) == key, up to rounding
        out += [math.nextafter(edge, 0.0), edge, math.nextafter(edge, math.inf)]
    return out


def _state(sk: BaseDDSketch) -> tuple[object, ...]:
    store = sk._store
    bins = {store.offset + i: c for i, c in enumerate(store.bins) if c}
    quantiles = [sk.get_quantile_value(q) for q in (0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0)]
    return (
        sk._count,
        sk._sum.hex() if isinstance(sk._sum, float) else sk._sum,
        sk._min,
        sk._max,
        sk._zero_count,
        bins,
        store.count,
        store.min_key,
        store.max_key,
        quantiles,
        sk._negative_store.count,
    )


def _prefilled() -> BaseDDSketch:
    sk = new_sketch()
    for v in _lognormal(9, 300, 3.0, 1.0):
        sk.add(v)
    return sk


def _restored() -> BaseDDSketch:
    return sketch_of(dense_of(_prefilled(), RELATIVE_ACCURACY))


def _cubic() -> BaseDDSketch:
    return BaseDDSketch(CubicallyInterpolatedMapping(0.01), DenseStore(), DenseStore(), 0.0)


CASES: list[tuple[str, Callable[[], BaseDDSketch], list[Values]]] = [
    ("latencies", new_sketch, [_lognormal(1, 5000, 5.0, 1.2)]),
    ("many_sketches", new_sketch, [_lognormal(s, 40 + 17 * s, s % 5, 0.8) for s in range(30)]),
    ("zeros_and_tiny", new_sketch, [[0.0, 0.0, 1e-320, 5e-324, 2.5, 0.0, 1e-300, 7.0]]),
    ("integer_tokens", new_sketch, [[random.Random(3).randint(0, 9000) for _ in range(3000)]]),
    ("bucket_boundaries", new_sketch, [_boundaries()]),
    ("into_filled_sketch", _prefilled, [_lognormal(2, 2000, 1.0, 2.0)]),
    ("into_sketch_from_rollup", _restored, [_lognormal(4, 500, 3.0, 0.5)]),
    ("huge_and_small", new_sketch, [[1e-9, 1e300, 3.0, 1e-200, 42.0]]),
    ("one_value", new_sketch, [[12.5]]),
    ("empty_list", new_sketch, [[], [1.0, 2.0]]),
    ("negative_falls_back", new_sketch, [[3.0, -2.0, 5.0], [1.0, 9.0]]),
    ("nan_falls_back", new_sketch, [[math.nan, 1.0, 2.0], [4.0]]),
    ("other_mapping_falls_back", _cubic, [_lognormal(5, 300, 2.0, 1.0)]),
]


@pytest.mark.parametrize(
    ("make", "lists"), [(m, v) for _, m, v in CASES], ids=[c[0] for c in CASES]
)
def test_add_values_equals_adding_one_by_one(
    make: Callable[[], BaseDDSketch], lists: list[Values]
) -> None:
    one_by_one = [make() for _ in lists]
    for sk, values in zip(one_by_one, lists, strict=True):
        for v in values:
            sk.add(v)
    batched = [make() for _ in lists]
    add_values(list(zip(batched, lists, strict=True)))
    for want, got in zip(one_by_one, batched, strict=True):
        assert _state(got) == _state(want)


def test_sketches_of_other_accuracies_in_one_call_stay_exact() -> None:
    values = _lognormal(6, 2000, 4.0, 1.0)
    want = [DDSketch(0.01), DDSketch(0.05)]
    for sk in want:
        for v in values:
            sk.add(v)
    got = [DDSketch(0.01), DDSketch(0.05)]
    add_values([(got[0], values), (got[1], values)])
    assert [_state(s) for s in got] == [_state(s) for s in want]


def test_a_batch_of_records_fills_buckets_as_one_record_at_a_time_does() -> None:
    now = 1_700_000_000_000
    recs = bench_records(3000, now, 300_000, seed=7, prefix="b")
    classes = TelemetrySettings().classes()
    whole: dict[BucketKey, Bucket] = {}
    add_records(whole, recs, classes, 60_000)
    single: dict[BucketKey, Bucket] = {}
    for rec in recs:
        add_records(single, [rec], classes, 60_000)
    assert whole.keys() == single.keys()
    for key, b in whole.items():
        assert encode_bucket(b, RELATIVE_ACCURACY) == encode_bucket(single[key], RELATIVE_ACCURACY)
        for name, sk in b.sketches.items():
            assert _state(sk) == _state(single[key].sketches[name])
