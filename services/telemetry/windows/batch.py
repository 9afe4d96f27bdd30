"""Many values into many ``ddsketch`` sketches at once (pure): what ``sk.add(v)`` per value
does, with the index mapping computed for a whole batch in numpy.

Rule: :func:`add_values` leaves every sketch exactly as ``for v in values: sk.add(v)`` would —
same bins (key -> count), zero count, count, sum (added in the same order), min and max — so
every quantile, merge and encoding is the same. Ingest calls it once per batch with every
(sketch, values) pair the batch touched.

How: the sketches of a ``DDSketch(relative_accuracy=...)`` use a ``LogarithmicMapping``
(``key(v) = ceil(log2(v) * multiplier) + offset``) and a ``DenseStore``. The logarithms of the
whole batch are one numpy call; numpy's ``log`` may differ from the C library's in the last
bit, which can change the ceiling only when ``log2(v) * multiplier`` is next to an integer, so
those few values (within 1e-6 of one) get their key from the mapping itself. Counts per
(sketch, key) come from one ``np.unique`` and go into each store as one weighted add per key
(integer-valued float counts: adding 1.0 n times and adding n are the same float), the
store's range grown once to cover the batch's lowest and highest key. A sketch
with another mapping or store, or a value that is negative, NaN or infinite, is added to value
by value (the exact path, never taken by validated records).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain, pairwise

import numpy as np
from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

__all__ = ["add_values"]

_NEAR = 1e-6
"""How close to an integer ``log_gamma(v)`` must be for its key to be computed exactly."""


def add_values(pairs: Sequence[tuple[BaseDDSketch, Sequence[float]]]) -> None:
    """``for v in values: sk.add(v)`` for every ``(sk, values)`` pair (module doc)."""
    fast: list[tuple[BaseDDSketch, Sequence[float]]] = []
    ref: LogarithmicMapping | None = None
    for sk, values in pairs:
        if not values:
            continue
        m = sk._mapping
        if ref is None and type(m) is LogarithmicMapping:
            ref = m
        if _batchable(sk, ref) and _plain(values):
            fast.append((sk, values))
        else:
            for v in values:
                sk.add(v)
    if fast and ref is not None:
        _add_fast(fast, ref)


def _batchable(sk: BaseDDSketch, ref: LogarithmicMapping | None) -> bool:
    m = sk._mapping
    return (
        ref is not None
        and type(m) is LogarithmicMapping
        and type(sk._store) is DenseStore
        and (m.gamma, m._multiplier, m._offset) == (ref.gamma, ref._multiplier, ref._offset)
    )


def _plain(values: Sequence[float]) -> bool:
    """Not negative, and finite (a NaN or infinity makes the sum NaN or infinite; so does an
    overflow, which only sends the values down the exact path)."""
    return min(values) >= 0.0 and math.isfinite(sum(values))


def _add_fast(pairs: list[tuple[BaseDDSketch, Sequence[float]]], m: LogarithmicMapping) -> None:
    lengths = np.fromiter((len(v) for _, v in pairs), dtype=np.int64, count=len(pairs))
    arr = np.fromiter(chain.from_iterable(v for _, v in pairs), np.float64, int(lengths.sum()))
    group = np.repeat(np.arange(len(pairs)), lengths)
    pos = arr > m.min_possible
    zeros = np.bincount(group[~pos], minlength=len(pairs)).tolist()
    vals, gpos = arr[pos], group[pos]
    if vals.size:
        x = np.log(vals) / math.log(2.0) * m._multiplier
        ikeys = (np.ceil(x) + m._offset).astype(np.int64)
        for i in np.flatnonzero(np.abs(x - np.rint(x)) < _NEAR).tolist():
            ikeys[i] = m.key(float(vals[i]))
        lo = int(ikeys.min())
        span = int(ikeys.max()) - lo + 1
        uniq, counts = np.unique(gpos * span + (ikeys - lo), return_counts=True)
        groups, keys = np.divmod(uniq, span)
        cuts = [0, *(np.flatnonzero(np.diff(groups)) + 1).tolist(), len(uniq)]
        all_keys, all_counts, all_groups = (keys + lo).tolist(), counts.tolist(), groups.tolist()
        for start, end in pairwise(cuts):
            _add_counts(
                pairs[all_groups[start]][0]._store,
                all_keys[start:end],
                all_counts[start:end],
            )
    for (sk, values), zero in zip(pairs, zeros, strict=True):
        sk._zero_count += float(zero)
        sk._count += float(len(values))
        total = sk._sum
        for v in values:
            total += v * 1.0
        sk._sum = total
        lo_v, hi_v = min(values), max(values)
        if lo_v < sk._min:
            sk._min = lo_v
        if hi_v > sk._max:
            sk._max = hi_v


def _add_counts(store: DenseStore, keys: list[int], counts: list[int]) -> None:
    """``store.add(key, count)`` for each (ascending) key: the range grown once for all."""
    store._extend_range(keys[0], keys[-1])
    bins, offset = store.bins, store.offset
    for key, n in zip(keys, counts, strict=True):
        bins[key - offset] += n
    store.count += float(sum(counts))
