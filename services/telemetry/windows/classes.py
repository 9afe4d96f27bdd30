"""SLO classes as telemetry judges attainment (pure)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SLOClass"]


@dataclass(frozen=True)
class SLOClass:
    """``percentile`` (e.g. 90): the class is met when at least that share of its requests
    meets both targets. ``ttft_ms``/``tpot_ms``: targets, 0 = none."""

    name: str
    percentile: float
    ttft_ms: float
    tpot_ms: float
