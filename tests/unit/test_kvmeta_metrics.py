"""kvmeta's Prometheus collector reports index, ingest and object-master state."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from tideserve.v1 import events_pb2

from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.metrics import KVMetaCollector
from services.kvmeta.objects import ObjectMaster, ReplicaConfig, SegmentSpec


def batch(inst: str, seq: int, hashes: list[int]) -> events_pb2.KVEventBatch:
    ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED, tier=1, block_hashes=hashes)
    return events_pb2.KVEventBatch(deployment="d", instance_id=inst, epoch=1, seq=seq, events=[ev])


@pytest.mark.parametrize(
    ("metric", "labels", "value"),
    [
        ("tideserve_kvmeta_index_entries", {"deployment": "d"}, 5.0),
        ("tideserve_kvmeta_index_instances", {"deployment": "d", "stale": "true"}, 1.0),
        ("tideserve_kvmeta_index_instances", {"deployment": "d", "stale": "false"}, 1.0),
        ("tideserve_kvmeta_ingest_batches_total", {"outcome": "skipped"}, 1.0),
        ("tideserve_kvmeta_ingest_batches_total", {"outcome": "resync_needed"}, 1.0),
        (
            "tideserve_kvmeta_segment_used_bytes",
            {"deployment": "d", "segment": "s", "tier": "2"},
            64.0,
        ),
        ("tideserve_kvmeta_objects", {"status": "processing"}, 1.0),
        ("tideserve_kvmeta_resync_requests_total", {}, 2.0),
    ],
    ids=[
        "entries",
        "stale",
        "live",
        "skipped",
        "resync",
        "segment-used",
        "objects",
        "resync-requests",
    ],
)
def test_collector(metric: str, labels: dict[str, str], value: float) -> None:
    feeder = IndexFeeder(PrefixIndex(), lambda: 0.0)
    feeder.apply(batch("a", 1, [1, 2, 3]))
    feeder.apply(batch("a", 1, [1, 2, 3]))  # duplicate
    feeder.apply(batch("b", 4, [1, 2]))  # gap
    feeder.resync_requests_sent = 2  # published by its resync loop (needs Redis)
    om = ObjectMaster()
    om.mount_segment("d", SegmentSpec("s", "a", 2, 1024, "x:1"), 0.0)
    om.put_start("d", "t", "k", 64, ReplicaConfig(), 0.0)
    reg = CollectorRegistry()
    reg.register(KVMetaCollector(feeder, om))
    assert reg.get_sample_value(metric, labels) == value


@pytest.mark.parametrize(
    ("metric", "labels", "value"),
    [
        ("tideserve_kvmeta_prefetches_total", {"outcome": "started"}, 3.0),
        ("tideserve_kvmeta_prefetches_total", {"outcome": "late"}, 1.0),
        ("tideserve_kvmeta_retention_events_total", {"event": "ticks"}, 7.0),
    ],
    ids=["prefetch-started", "prefetch-late", "retention-ticks"],
)
def test_retention_counters(metric: str, labels: dict[str, str], value: float) -> None:
    stats = {"ticks": 7, "prefetch_started": 3, "prefetch_late": 1}
    reg = CollectorRegistry()
    reg.register(KVMetaCollector(IndexFeeder(PrefixIndex(), lambda: 0.0), ObjectMaster(),
                                 retention=stats))  # fmt: skip
    assert reg.get_sample_value(metric, labels) == value
