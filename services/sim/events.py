"""The discrete-event queue (pure): events ordered by modelled time, then by insertion.

No wall clock: time only advances by popping the next event. Equal times pop in the order
they were pushed, so a run is a function of its inputs alone.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["EventQueue", "fewer_collections"]


class EventQueue:
    """A heap of ``(time_ms, seq, kind, payload)``."""

    __slots__ = ("_heap", "_seq", "now")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.now = 0.0

    def push(self, at: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self._heap, (at, self._seq, kind, payload))
        self._seq += 1

    def pop(self) -> tuple[float, str, Any]:
        """The next event; advances ``now`` to its time. IndexError when empty."""
        at, _, kind, payload = heapq.heappop(self._heap)
        self.now = at
        return at, kind, payload

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def heap(self) -> list[tuple[float, int, str, Any]]:
        """The heap itself, for a loop that pops with ``heapq.heappop`` and sets ``now``."""
        return self._heap

    @property
    def pushed(self) -> int:
        """Events pushed so far (a measure of the run's work)."""
        return self._seq


@contextmanager
def fewer_collections(gen0: int = 100_000) -> Iterator[None]:
    """The cyclic garbage collector runs less often inside: a big fleet's run allocates
    millions of small objects (cache blocks, views, records) that live long, and at the
    default threshold the collector's passes over them were a fifth of the run's CPU time.
    What exists on entry is frozen (never scanned again until exit). Collection timing
    changes no result: the loop reads no object identities or finalizer effects."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(gen0, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
