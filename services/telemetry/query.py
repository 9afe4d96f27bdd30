"""Window queries (shell): recent buckets from this replica's memory, older ones and other
replicas' from the rollups, merged exactly (:func:`~.windows.stats.merge_slices`).

``source`` says where the buckets came from: ``"memory"`` when every bucket of the window
is within memory's range and no other replica has rows in it (whether other replicas
exist is checked at most every ``peer_check_s``, so a new replica's rows show up within that), ``"rollups"`` when the window
is entirely older than memory, ``"memory+rollups"`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import chain

from services.telemetry.store.pg import RecordStore
from services.telemetry.windows.bucket import BucketKey, Summary
from services.telemetry.windows.classes import SLOClass
from services.telemetry.windows.memory import WindowMemory, split_window
from services.telemetry.windows.stats import (
    Filters,
    WindowStats,
    merge_slices,
    window_bounds,
    window_stats,
)

__all__ = ["Window", "WindowQuery", "memory_window"]


@dataclass(frozen=True)
class Window:
    total: WindowStats
    slices: tuple[WindowStats, ...]
    source: str


class WindowQuery:
    def __init__(
        self,
        store: RecordStore | None,
        memory: WindowMemory,
        classes: Mapping[str, SLOClass],
        replica_id: str,
        wall: Callable[[], float],
        *,
        peer_check_s: float = 10.0,
    ) -> None:
        self.store = store
        self.memory = memory
        self.classes = dict(classes)
        self.replica_id = replica_id
        self._wall = wall
        self._peer_check_ms = int(peer_check_s * 1000)
        self._peers_checked_ms: int | None = None
        self._peers = True

    async def _peers_present(self, now_ms: int) -> bool:
        """Whether other replicas wrote rollups within memory's range (asked at most every
        ``peer_check_s``; until then the last answer holds)."""
        assert self.store is not None
        checked = self._peers_checked_ms
        if checked is None or now_ms - checked >= self._peer_check_ms:
            floor = self.memory.floor(now_ms)
            self._peers = await self.store.has_other_replicas(self.replica_id, floor)
            self._peers_checked_ms = now_ms
        return self._peers

    async def query(self, filters: Filters, window_s: float, end_ms: int = 0) -> Window:
        """ValueError for ``window_s <= 0``."""
        now = int(self._wall() * 1000)
        start, end = window_bounds(end_ms or now, window_s, self.memory.bucket_ms)
        (m_start, m_end), (r_start, r_end) = split_window(start, end, self.memory.floor(now))
        own = self.memory.summaries(m_start, m_end) if m_start < m_end else []
        old: list[tuple[BucketKey, Summary]] = []
        peers: list[tuple[BucketKey, Summary]] = []
        if self.store is not None:
            old = await self.store.read_rollups(r_start, r_end, filters)
            if m_start < m_end and await self._peers_present(now):
                peers = await self.store.read_rollups(
                    m_start, m_end, filters, exclude_replica=self.replica_id
                )
        in_memory = m_start < m_end
        from_rollups = r_start < r_end or bool(peers)
        source = (
            "memory+rollups"
            if in_memory and from_rollups
            else "rollups"
            if from_rollups
            else "memory"
        )
        slices = merge_slices(chain(own, old, peers), start, end, filters)
        total, per_slice = window_stats(slices, start, end, filters, self.classes)
        return Window(total, tuple(per_slice), source)


def memory_window(
    memory: WindowMemory,
    classes: Mapping[str, SLOClass],
    filters: Filters,
    window_s: float,
    now_ms: int,
) -> Window:
    """The window from this replica's memory alone (no I/O: gauges, the model side)."""
    start, end = window_bounds(now_ms, window_s, memory.bucket_ms)
    slices = merge_slices(memory.summaries(start, end), start, end, filters)
    total, per_slice = window_stats(slices, start, end, filters, classes)
    return Window(total, tuple(per_slice), "memory")
