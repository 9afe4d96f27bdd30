"""Space inside one segment (first-fit free list) and replica placement policies. Pure."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

POLICIES = ("random", "free_ratio_first", "local_first")
DEFAULT_POLICY = "free_ratio_first"


class FreeList:
    """First-fit allocator over ``[0, capacity)``; neighbours coalesce on free."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._starts: list[int] = [0] if capacity > 0 else []
        self._sizes: list[int] = [capacity] if capacity > 0 else []
        self.used = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def alloc(self, size: int) -> int | None:
        """Offset of a new range of ``size`` bytes, or None if no hole is big enough."""
        for i, hole in enumerate(self._sizes):
            if hole >= size:
                off = self._starts[i]
                if hole == size:
                    del self._starts[i]
                    del self._sizes[i]
                else:
                    self._starts[i] = off + size
                    self._sizes[i] = hole - size
                self.used += size
                return off
        return None

    def reserve(self, offset: int, size: int) -> bool:
        """Mark ``[offset, offset+size)`` used (restore from storage). False if not free."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset + size > self._starts[i] + self._sizes[i]:
            return False
        start, hole = self._starts[i], self._sizes[i]
        left, right = offset - start, start + hole - (offset + size)
        new_s = [s for s, n in ((start, left), (offset + size, right)) if n > 0]
        new_n = [n for n in (left, right) if n > 0]
        self._starts[i : i + 1] = new_s
        self._sizes[i : i + 1] = new_n
        self.used += size
        return True

    def release(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self._starts, offset)
        self._starts.insert(i, offset)
        self._sizes.insert(i, size)
        self.used -= size
        if i + 1 < len(self._starts) and offset + size == self._starts[i + 1]:
            self._sizes[i] += self._sizes.pop(i + 1)
            del self._starts[i + 1]
        if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == offset:
            self._sizes[i - 1] += self._sizes.pop(i)
            del self._starts[i]


@dataclass(frozen=True)
class Candidate:
    """A segment that could hold a replica: name, free bytes, capacity."""

    name: str
    free: int
    capacity: int


def choose_segments(
    policy: str,
    candidates: Sequence[Candidate],
    count: int,
    size: int,
    *,
    preferred: str = "",
    rng: random.Random | None = None,
) -> list[str]:
    """Up to ``count`` distinct segment names with at least ``size`` free, in preference order.

    ``random``: uniform among fitting segments; ``free_ratio_first``: highest free/capacity
    first (ties by name); ``local_first``: ``preferred`` first if it fits, then free ratio.
    Raises ValueError for an unknown policy. May return fewer than ``count``.
    """
    fitting = [c for c in candidates if c.free >= size]
    if policy == "random":
        r = rng or random.Random(0)
        return [c.name for c in r.sample(fitting, min(count, len(fitting)))]
    key: Callable[[Candidate], tuple[float, str]] = lambda c: (-c.free / c.capacity, c.name)  # noqa: E731
    if policy == "free_ratio_first":
        return [c.name for c in sorted(fitting, key=key)[:count]]
    if policy == "local_first":
        first = [c for c in fitting if c.name == preferred]
        rest = sorted((c for c in fitting if c.name != preferred), key=key)
        return [c.name for c in (first + rest)[:count]]
    raise ValueError(f"unknown placement policy {policy!r}; known: {', '.join(POLICIES)}")
