"""The telemetry Prometheus view: gauge names and labels the dashboard reads, counters."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.telemetry.ingest.pipeline import IngestCounts
from services.telemetry.metrics import TelemetryCollector
from services.telemetry.settings import TelemetrySettings
from services.telemetry.windows.bucket import add_records_to
from services.telemetry.windows.memory import WindowMemory
from tests.helpers.records import NOW_MS, record


def test_gauges_per_slice_merge_tenants_and_counters_by_result_and_reason() -> None:
    classes = TelemetrySettings().classes()
    memory = WindowMemory(60_000, 900_000)
    recs = [record("a", tenant="t1"), record("b", tenant="t2"), record("p", disaggregated=True)]
    add_records_to(memory.bucket, recs, classes, 60_000)
    counts = IngestCounts(Counter(accepted=3, duplicate=1, rejected=2), Counter(future=2))
    registry = CollectorRegistry()
    registry.register(
        TelemetryCollector(memory, classes, counts, lambda: 4, 60.0, lambda: NOW_MS / 1000)
    )
    samples = {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for smp in fam.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    worker = {"deployment": "llama", "role": "worker", "slo_class": "interactive"}
    prefix = "tideserve_telemetry_window_"
    assert value(prefix + "ttft_ms", **worker, quantile="0.99") > 0
    for name in ("tpot_ms", "queue_ms"):
        assert value(prefix + name, **worker, quantile="0.5") > 0
    assert value(prefix + "cache_hit_ratio", **worker) == 0.6
    for name in ("request_rate", "cached_tokens_error_ratio", "slo_attainment"):
        assert value(prefix + name, **worker) > 0
    roles = {dict(labels).get("role") for name, labels in samples if name.startswith(prefix)}
    assert roles == {"worker", "prefill", "decode"}
    assert not any("tenant" in dict(labels) for _, labels in samples)  # bounded label sets
    assert (
        value(prefix + "request_rate", **worker)
        == value(prefix + "request_rate", **{**worker, "role": "prefill"}) * 2
    )  # two tenants' records merged into one worker slice
    assert value("tideserve_telemetry_records_total", result="accepted") == 3
    assert value("tideserve_telemetry_records_total", result="rejected") == 6  # 2 + 4 undecodable
    assert value("tideserve_telemetry_records_rejected_total", reason="undecodable") == 4
    assert value("tideserve_telemetry_records_rejected_total", reason="future") == 2
