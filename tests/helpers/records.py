"""Request records for telemetry tests: valid by default, any field overridable."""

from __future__ import annotations

from typing import Any

from tideserve.v1 import events_pb2

__all__ = ["NOW_MS", "record"]

NOW_MS = 1_780_000_040_000
"""A fixed "now" (aligned to the minute + 20 s) for pure tests."""


def record(request_id: str = "r1", **fields: Any) -> events_pb2.RequestRecord:
    """A successful aggregated record finishing at ``NOW_MS - 1000`` unless overridden."""
    finish = fields.pop("finish_ms", NOW_MS - 1_000)
    base: dict[str, Any] = {
        "request_id": request_id,
        "deployment": "llama",
        "slo_class": "interactive",
        "tenant": "acme",
        "prompt_tokens": 1000,
        "cached_tokens": 600,
        "predicted_cached_tokens": 500,
        "completion_tokens": 100,
        "queue_ms": 5.0,
        "ttft_ms": 120.0,
        "tpot_ms": 20.0,
        "e2e_ms": 2100.0,
        "outcome": events_pb2.REQUEST_OUTCOME_OK,
        "arrival_ms": finish - 2100,
        "finish_ms": finish,
    }
    base.update(fields)
    return events_pb2.RequestRecord(**base)
