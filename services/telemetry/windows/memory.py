"""The recent buckets one telemetry replica holds in memory (pure: ``now`` is passed in).

Memory covers the buckets starting at or after :meth:`WindowMemory.floor` (``now -
memory_ms``, aligned); older ones are answered from the persisted rollups. The buckets hold
exactly what this replica committed (ingest applies a batch's delta only after its
transaction committed, and loads its own rollup rows back at start), so they equal this
replica's rollup rows for the same buckets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from services.telemetry.windows.bucket import Bucket, BucketKey, Summary, align

__all__ = ["WindowMemory", "split_window"]


class WindowMemory:
    def __init__(self, bucket_ms: int, memory_ms: int) -> None:
        if bucket_ms <= 0 or memory_ms < bucket_ms:
            raise ValueError("bucket_ms must be > 0 and memory_ms >= bucket_ms")
        self.bucket_ms = bucket_ms
        self.memory_ms = memory_ms
        self._buckets: dict[BucketKey, Bucket] = {}
        self._summaries: dict[BucketKey, tuple[int, Summary]] = {}

    def floor(self, now_ms: int) -> int:
        """Start of the oldest bucket memory answers for."""
        return align(now_ms - self.memory_ms, self.bucket_ms)

    def held(self, key: BucketKey, now_ms: int) -> bool:
        """Whether ``key``'s bucket belongs in memory (not older than the floor)."""
        return key[1] >= self.floor(now_ms)

    def get(self, key: BucketKey) -> Bucket | None:
        return self._buckets.get(key)

    def bucket(self, key: BucketKey) -> Bucket:
        """The bucket of ``key``, created empty if missing (ingest adds records into it)."""
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = Bucket()
        return b

    def replace(self, rows: Iterable[tuple[BucketKey, Bucket]]) -> None:
        """Set buckets wholesale (start-up: this replica's own rollup rows)."""
        for key, b in rows:
            self._buckets[key] = b
            self._summaries.pop(key, None)

    def clear(self) -> None:
        self._buckets.clear()
        self._summaries.clear()

    def evict(self, now_ms: int) -> int:
        """Drop buckets older than the floor; returns how many."""
        floor = self.floor(now_ms)
        old = [k for k in self._buckets if k[1] < floor]
        for k in old:
            del self._buckets[k]
            self._summaries.pop(k, None)
        return len(old)

    def items(
        self, start_ms: int = 0, end_ms: int | None = None
    ) -> Iterator[tuple[BucketKey, Bucket]]:
        for key, b in self._buckets.items():
            if key[1] >= start_ms and (end_ms is None or key[1] < end_ms):
                yield key, b

    def summaries(self, start_ms: int, end_ms: int) -> list[tuple[BucketKey, Summary]]:
        """The query form of the buckets in ``[start_ms, end_ms)``, each converted once per
        change (closed minutes are not converted again on every query)."""
        out = []
        for key, b in self.items(start_ms, end_ms):
            cached = self._summaries.get(key)
            if cached is None or cached[0] != b.version:
                cached = self._summaries[key] = (b.version, b.summary())
            out.append((key, cached[1]))
        return out

    def __len__(self) -> int:
        return len(self._buckets)


def split_window(
    start_ms: int, end_ms: int, floor_ms: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(memory, rollups)`` half-open ranges of ``[start_ms, end_ms)`` around ``floor_ms``
    (an empty range has start >= end)."""
    return (max(start_ms, floor_ms), end_ms), (start_ms, min(end_ms, floor_ms))
