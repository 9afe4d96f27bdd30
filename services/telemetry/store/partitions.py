"""Which ``request_records`` partitions to create and drop (pure).

A partition covers ``[start, start + partition_ms)`` of finish time and is named
``request_records_p<start_ms>``. Partitions exist from the retention floor to
``partitions_ahead`` partitions past now; one whose end is at or before ``now - retention``
holds only expired records and is dropped whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["droppable", "needed", "parse_name", "partition_name", "partition_start"]

_NAME = re.compile(r"^request_records_p(\d+)$")


def partition_start(ts_ms: int, partition_ms: int) -> int:
    return ts_ms - ts_ms % partition_ms


def partition_name(start_ms: int) -> str:
    return f"request_records_p{start_ms}"


def parse_name(name: str) -> int | None:
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def needed(now_ms: int, partition_ms: int, retention_ms: int, ahead: int) -> list[int]:
    """Starts of every partition that should exist at ``now_ms``."""
    first = partition_start(now_ms - retention_ms, partition_ms)
    last = partition_start(now_ms, partition_ms) + ahead * partition_ms
    return list(range(first, last + 1, partition_ms))


def droppable(
    existing: Iterable[int], now_ms: int, partition_ms: int, retention_ms: int
) -> list[int]:
    """Starts of existing partitions that hold only records older than the retention."""
    return sorted(s for s in existing if s + partition_ms <= now_ms - retention_ms)
