"""Sketches as dense numpy arrays, for the query side (pure).

A window merges hundreds of per-slice, per-minute sketches; merging ``ddsketch`` objects bin
by bin in Python made a 5-minute query over 72 slices take most of a second. A
:class:`Dense` holds the same bins (``bins[i]`` counts key ``offset + i`` of the sketch's
index mapping) as one float64 array: merging is array addition and a quantile is a cumulative
sum and a binary search, giving exactly what ``DDSketch.get_quantile_value`` gives for the
same bins (the rank rule of ``DenseStore.key_at_rank``, the value of the mapping's key).
Values are never negative here (validation rejects negative timings), so there is no
negative store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

__all__ = ["Dense", "dense_of", "merge_dense", "sketch_of"]

_MAPPINGS: dict[float, LogarithmicMapping] = {}


def mapping(accuracy: float) -> LogarithmicMapping:
    """The index mapping ``DDSketch(relative_accuracy=accuracy)`` uses."""
    m = _MAPPINGS.get(accuracy)
    if m is None:
        m = _MAPPINGS[accuracy] = LogarithmicMapping(accuracy)
    return m


class Dense:
    __slots__ = ("accuracy", "bins", "count", "hi", "lo", "offset", "sum", "zero")

    def __init__(
        self,
        accuracy: float,
        offset: int,
        bins: np.ndarray[Any, np.dtype[np.float64]],
        zero: float,
        count: float,
        total: float,
        lo: float,
        hi: float,
    ) -> None:
        self.accuracy = accuracy
        self.offset = offset
        self.bins = bins
        self.zero = zero
        self.count = count
        self.sum = total
        self.lo = lo
        self.hi = hi

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """:meth:`get_quantile_value` of each of ``qs`` (0.0 when empty), one cumulative sum."""
        if self.count == 0:
            return [0.0 for _ in qs]
        cum = np.cumsum(self.bins)
        ranks = np.array([q * (self.count - 1) - self.zero for q in qs])
        idx = np.searchsorted(cum, ranks, side="right").tolist()
        m = mapping(self.accuracy)
        top = len(cum) - 1
        out = []
        for rank, i in zip(ranks.tolist(), idx, strict=True):
            if rank < 0:
                out.append(0.0)
                continue
            if i > top:
                nonzero = np.flatnonzero(self.bins)
                i = int(nonzero[-1]) if nonzero.size else 0
            out.append(float(m.value(self.offset + i)))
        return out

    def get_quantile_value(self, q: float) -> float | None:
        """As ``DDSketch.get_quantile_value``: None when empty or ``q`` outside [0, 1]."""
        if q < 0 or q > 1 or self.count == 0:
            return None
        rank = q * (self.count - 1)
        if rank < self.zero:
            return 0.0
        cum = np.cumsum(self.bins)
        idx = int(np.searchsorted(cum, rank - self.zero, side="right"))
        if idx >= len(cum):  # rounding at the very top: the highest non-empty bin
            nonzero = np.flatnonzero(self.bins)
            idx = int(nonzero[-1]) if nonzero.size else 0
        return float(mapping(self.accuracy).value(self.offset + idx))


def dense_of(sk: BaseDDSketch, accuracy: float) -> Dense:
    """The bins of a ``ddsketch`` sketch, read from its stores (what its protobuf form,
    ``DDSketchProto.to_proto``, would carry, without building that message: ingest converts
    every bucket a batch touched)."""
    if any(sk._negative_store.bins):
        raise ValueError("negative values are not supported")
    store = sk._store
    bins = np.array(store.bins, dtype=np.float64)
    nonzero = np.flatnonzero(bins)
    first, last = (int(nonzero[0]), int(nonzero[-1]) + 1) if nonzero.size else (0, 0)
    return Dense(
        accuracy,
        int(store.offset) + first,
        bins[first:last],  # the store's zero padding trimmed
        float(sk._zero_count),
        float(sk.count),
        float(sk.sum),
        float(sk._min),
        float(sk._max),
    )


def sketch_of(d: Dense) -> BaseDDSketch:
    """A ``ddsketch`` sketch with ``d``'s bins, count, sum, min and max (ingest keeps adding
    to it)."""
    store = DenseStore()
    for i in np.flatnonzero(d.bins):
        store.add(d.offset + int(i), float(d.bins[i]))
    sk = BaseDDSketch(
        mapping=mapping(d.accuracy), store=store, negative_store=DenseStore(), zero_count=d.zero
    )
    sk._sum, sk._min, sk._max = d.sum, d.lo, d.hi
    return sk


def merge_dense(parts: Sequence[Dense]) -> Dense:
    """One sketch holding every value of ``parts`` (same accuracy)."""
    if len(parts) == 1:
        return parts[0]
    accuracy = parts[0].accuracy
    if any(p.accuracy != accuracy for p in parts):
        raise ValueError("sketches of different relative accuracies do not merge")
    start = min(p.offset for p in parts)
    end = max(p.offset + len(p.bins) for p in parts)
    bins = np.zeros(end - start, dtype=np.float64)
    for p in parts:
        bins[p.offset - start : p.offset - start + len(p.bins)] += p.bins
    return Dense(
        accuracy,
        start,
        bins,
        sum(p.zero for p in parts),
        sum(p.count for p in parts),
        sum(p.sum for p in parts),
        min(p.lo for p in parts),
        max(p.hi for p in parts),
    )
