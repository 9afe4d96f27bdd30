"""Prometheus view of kvmeta's state, read at scrape time (no counters on the hot path).

Register with ``registry.register(KVMetaCollector(feeder, master))`` on the service's registry;
``retention``: the retention controller's counters (its ``stats``), when it runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.objects import COMPLETE, ObjectMaster

__all__ = ["KVMetaCollector"]


class KVMetaCollector(Collector):
    def __init__(
        self,
        feeder: IndexFeeder,
        master: ObjectMaster,
        *,
        retention: Mapping[str, int] | None = None,
    ) -> None:
        self.feeder = feeder
        self.master = master
        self.retention = retention

    def collect(self) -> Iterator[Metric]:
        index = self.feeder.index
        entries = GaugeMetricFamily(
            "tideserve_kvmeta_index_entries",
            "(block, tier, instance) entries in the prefix index",
            labels=["deployment"],
        )
        instances = GaugeMetricFamily(
            "tideserve_kvmeta_index_instances",
            "instances known to the prefix index (stale ones await a resync)",
            labels=["deployment", "stale"],
        )
        for dep in index.deployments():
            infos = index.instances(dep)
            entries.add_metric([dep], sum(i.blocks for i in infos))
            stale = sum(1 for i in infos if i.stale)
            instances.add_metric([dep, "false"], len(infos) - stale)
            instances.add_metric([dep, "true"], stale)
        yield entries
        yield instances
        batches = CounterMetricFamily(
            "tideserve_kvmeta_ingest_batches",
            "KV event batches ingested, by outcome (applied, skipped, resync_needed)",
            labels=["outcome"],
        )
        for outcome, n in sorted(self.feeder.outcomes.items()):
            batches.add_metric([outcome], n)
        yield batches
        yield CounterMetricFamily(
            "tideserve_kvmeta_resync_requests",
            "ResyncRequests published to stale instances (retries included)",
            value=self.feeder.resync_requests_sent,
        )
        used = GaugeMetricFamily(
            "tideserve_kvmeta_segment_used_bytes",
            "bytes allocated in a segment",
            labels=["deployment", "segment", "tier"],
        )
        cap = GaugeMetricFamily(
            "tideserve_kvmeta_segment_capacity_bytes",
            "capacity of a segment",
            labels=["deployment", "segment", "tier"],
        )
        for dep in self.master.deployments():
            for seg in self.master.segments(dep):
                labels = [dep, seg.spec.name, str(seg.spec.tier)]
                used.add_metric(labels, seg.used_bytes)
                cap.add_metric(labels, seg.spec.capacity_bytes)
        yield used
        yield cap
        objects = GaugeMetricFamily(
            "tideserve_kvmeta_objects",
            "objects in the object master by status",
            labels=["status"],
        )
        complete, processing = self.master.object_counts()
        objects.add_metric([COMPLETE], complete)
        objects.add_metric(["processing"], processing)
        yield objects
        if self.retention is not None:
            yield from self._retention(self.retention)

    @staticmethod
    def _retention(stats: Mapping[str, int]) -> Iterator[Metric]:
        prefetches = CounterMetricFamily(
            "tideserve_kvmeta_prefetches",
            "session prefetches by outcome: planned (observe: would start), started, "
            "finished, failed, late (the turn came first), used, expired",
            labels=["outcome"],
        )
        events = CounterMetricFamily(
            "tideserve_kvmeta_retention_events",
            "retention controller counters (ticks, plans, applied, errors, sessions and "
            "blocks protected or offloaded)",
            labels=["event"],
        )
        for name, n in sorted(stats.items()):
            if name.startswith("prefetch_"):
                prefetches.add_metric([name.removeprefix("prefetch_")], n)
            else:
                events.add_metric([name], n)
        yield prefetches
        yield events
