"""The seams between telemetry's ingest/windows side and its performance-model side.

Ingest calls every :class:`RecordObserver` with the records it has just committed (each
record once per commit; a redelivered duplicate is not passed again). The servicer answers
``GetPerfModel`` and ``GetRecommendation`` through a :class:`ModelRpc`, or UNIMPLEMENTED when
none is wired. A :class:`WindowSource` gives the model side the current traffic of a
deployment (the same statistics ``QueryWindow`` answers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tideserve.v1 import events_pb2, telemetry_pb2

__all__ = ["ModelRpc", "RecordObserver", "WindowSource"]


class RecordObserver(Protocol):
    def observe_records(self, now_ms: int, records: Sequence[events_pb2.RequestRecord]) -> None:
        """Called after ``records`` are durable. Must not block (no I/O)."""


class WindowSource(Protocol):
    def window(
        self, deployment: str, window_s: float, now_ms: int
    ) -> telemetry_pb2.QueryWindowResponse:
        """The window ending at ``now_ms`` over ``deployment`` (total and slices)."""


class ModelRpc(Protocol):
    def perf_model(
        self, request: telemetry_pb2.GetPerfModelRequest, now_ms: int
    ) -> telemetry_pb2.GetPerfModelResponse:
        """Raise ``LookupError`` for an unknown deployment (the servicer answers NOT_FOUND)."""

    def recommendation(
        self, request: telemetry_pb2.GetRecommendationRequest, now_ms: int
    ) -> telemetry_pb2.GetRecommendationResponse:
        """Raise ``LookupError`` for an unknown deployment, ``ValueError`` for a bad request."""
