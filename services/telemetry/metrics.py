"""Prometheus view of telemetry, computed at scrape time from memory (no loop, no I/O).

Gauges per slice (deployment, role, slo_class; tenants merged) over the last
``gauge_window_s`` (these names are what deploy/'s Grafana dashboard reads):
``tideserve_telemetry_window_ttft_ms`` and ``..._tpot_ms`` and ``..._queue_ms``
{quantile="0.5"|"0.9"|"0.99"}, ``..._request_rate``, ``..._cache_hit_ratio``,
``..._cached_tokens_error_ratio``, ``..._slo_attainment``. Counters:
``tideserve_telemetry_records_total{result=accepted|duplicate|rejected}`` and
``tideserve_telemetry_records_rejected_total{reason}`` (validation codes, plus
``undecodable`` for stream entries that do not parse, dead-lettered by the consumer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.telemetry.ingest.pipeline import IngestCounts
from services.telemetry.windows.classes import SLOClass
from services.telemetry.windows.memory import WindowMemory
from services.telemetry.windows.stats import (
    Filters,
    Percentiles,
    merge_slices,
    window_bounds,
    window_stats,
)
from services.telemetry.windows.validate import REASONS

__all__ = ["TelemetryCollector"]

_LABELS = ["deployment", "role", "slo_class"]
_Q = ("0.5", "0.9", "0.99")


class TelemetryCollector(Collector):
    def __init__(
        self,
        memory: WindowMemory,
        classes: Mapping[str, SLOClass],
        counts: IngestCounts,
        undecodable: Callable[[], int],
        window_s: float,
        wall: Callable[[], float],
    ) -> None:
        self._memory = memory
        self._classes = dict(classes)
        self._counts = counts
        self._undecodable = undecodable
        self._window_s = window_s
        self._wall = wall

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = int(self._wall() * 1000)
        start, end = window_bounds(now, self._window_s, self._memory.bucket_ms)
        untenanted = (
            ((key._replace(tenant=""), bstart), b)
            for (key, bstart), b in self._memory.summaries(start, end)
        )
        slices = merge_slices(untenanted, start, end, Filters())
        _total, stats = window_stats(slices, start, end, Filters(), self._classes)
        fams = {
            name: GaugeMetricFamily(
                f"tideserve_telemetry_window_{name}",
                f"{name} over the last window",
                labels=[*_LABELS, "quantile"],
            )
            for name in ("ttft_ms", "tpot_ms", "queue_ms")
        }
        plain = {
            "request_rate": "arrivals per second",
            "cache_hit_ratio": "cached / prompt tokens",
            "cached_tokens_error_ratio": "router's |predicted - cached| / prompt tokens",
            "slo_attainment": "share of requests meeting both targets of their class",
        }
        flat = {
            name: GaugeMetricFamily(f"tideserve_telemetry_window_{name}", text, labels=_LABELS)
            for name, text in plain.items()
        }
        for s in stats:
            labels = [s.deployment, s.role, s.slo_class]
            for name, fam in fams.items():
                p: Percentiles = getattr(s, name)
                for q, v in zip(_Q, (p.p50, p.p90, p.p99), strict=True):
                    fam.add_metric([*labels, q], v)
            flat["request_rate"].add_metric(labels, s.request_rate_rps)
            flat["cache_hit_ratio"].add_metric(labels, s.cache_hit_ratio)
            flat["cached_tokens_error_ratio"].add_metric(labels, s.cached_tokens_error_ratio)
            flat["slo_attainment"].add_metric(labels, s.slo_attainment)
        yield from fams.values()
        yield from flat.values()
        records = CounterMetricFamily(
            "tideserve_telemetry_records", "request records ingested, by result", labels=["result"]
        )
        undecodable = self._undecodable()
        for result in ("accepted", "duplicate", "rejected"):
            extra = undecodable if result == "rejected" else 0
            records.add_metric([result], self._counts.results[result] + extra)
        yield records
        rejected = CounterMetricFamily(
            "tideserve_telemetry_records_rejected",
            "request records rejected (dead-lettered), by reason",
            labels=["reason"],
        )
        for reason in REASONS:
            rejected.add_metric([reason], self._counts.reasons[reason])
        rejected.add_metric(["undecodable"], undecodable)
        yield rejected
