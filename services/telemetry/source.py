"""A :class:`~services.telemetry.ports.WindowSource` over this replica's memory (no I/O):
what the model side is handed. It sees the records this replica committed (every replica
consumes its share of the stream and keeps its own model), not other replicas' rollups."""

from __future__ import annotations

from collections.abc import Mapping

from tideserve.v1 import telemetry_pb2

from services.telemetry.query import memory_window
from services.telemetry.translate import window_response
from services.telemetry.windows.classes import SLOClass
from services.telemetry.windows.memory import WindowMemory
from services.telemetry.windows.stats import Filters

__all__ = ["MemoryWindowSource"]


class MemoryWindowSource:
    def __init__(self, memory: WindowMemory, classes: Mapping[str, SLOClass]) -> None:
        self._memory = memory
        self._classes = dict(classes)

    def window(
        self, deployment: str, window_s: float, now_ms: int
    ) -> telemetry_pb2.QueryWindowResponse:
        w = memory_window(
            self._memory, self._classes, Filters(deployment=deployment), window_s, now_ms
        )
        return window_response(w)
