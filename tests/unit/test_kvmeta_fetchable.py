"""Prefix matches credited with what the KV-cache tier holds (pure rule, then kvmeta's
MatchPrefix over a real index and object master)."""

from __future__ import annotations

import time

import pytest
from tideserve.v1 import events_pb2, kvmeta_pb2

from services.common.dataplane.blocks import block_key
from services.kvmeta.fetchable import REMOTE, leading_run, with_fetchable
from services.kvmeta.index import InstanceMatch, PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.objects import ObjectMaster, ReplicaConfig, SegmentSpec
from services.kvmeta.servicer import KVMetaServicer, ObjectShell

GPU = 1
A2 = InstanceMatch("a", 2, {GPU: 2})
B5 = InstanceMatch("b", 5, {GPU: 5})


@pytest.mark.parametrize(
    ("flags", "run"),
    [([], 0), ([False, True], 0), ([True, True, False, True], 2), ([True] * 3, 3)],
    ids=["empty", "first-missing", "stops-at-first-miss", "all"],
)
def test_leading_run(flags: list[bool], run: int) -> None:
    assert leading_run(flags) == run


@pytest.mark.parametrize(
    ("matches", "candidates", "tier_run", "want"),
    [
        ([A2], ["a", "c"], 0, [A2]),
        ([A2], ["a"], 4, [InstanceMatch("a", 4, {GPU: 2, REMOTE: 2})]),
        ([], ["c"], 3, [InstanceMatch("c", 3, {REMOTE: 3})]),
        ([B5, A2], ["a", "b"], 4, [B5, InstanceMatch("a", 4, {GPU: 2, REMOTE: 2})]),
        ([A2], ["c"], 4, [InstanceMatch("c", 4, {REMOTE: 4}), A2]),
        (
            [InstanceMatch("a", 3, {GPU: 1, REMOTE: 2})],
            ["a"],
            5,
            [InstanceMatch("a", 5, {GPU: 1, REMOTE: 4})],
        ),
    ],
    ids=[
        "tier-empty-unchanged",
        "local-prefix-extended-by-tier",
        "no-local-match-all-fetchable",
        "longer-local-match-kept-order-longest-first",
        "only-candidates-extended",
        "remote-blocks-add-up",
    ],
)
def test_with_fetchable(
    matches: list[InstanceMatch], candidates: list[str], tier_run: int, want: list[InstanceMatch]
) -> None:
    assert with_fetchable(matches, candidates, tier_run) == want


async def test_match_prefix_credits_the_tier_to_candidates() -> None:
    feeder = IndexFeeder(PrefixIndex(), time.time)
    ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED, tier=1, block_hashes=[11])
    feeder.apply(
        events_pb2.KVEventBatch(deployment="d", instance_id="a", epoch=1, seq=1, events=[ev])
    )
    master = ObjectMaster()
    servicer = KVMetaServicer(feeder, ObjectShell(master, None, time.time))
    req = kvmeta_pb2.MatchPrefixRequest(
        deployment="d", block_hashes=[11, 12, 13, 14], candidate_instances=["a", "b"]
    )

    async def matches() -> list[tuple[str, int, dict[int, int]]]:
        resp = await servicer.MatchPrefix(req, None)  # type: ignore[arg-type]
        return [
            (m.instance_id, m.matched_blocks, {t.tier: t.blocks for t in m.tiers})
            for m in resp.matches
        ]

    assert await matches() == [("a", 1, {1: 1})]  # no tier mounted: the index alone
    master.mount_segment("d", SegmentSpec("s", "kv", 2, 1 << 20, "x:1"), 0.0)
    keys = [block_key(h) for h in (11, 12, 13)]
    master.batch_put_start("d", "", keys, [64] * 3, ReplicaConfig(), 0.0)
    master.batch_put_end("d", "", keys, 0.0)
    assert await matches() == [("a", 3, {1: 1, REMOTE: 2}), ("b", 3, {REMOTE: 3})]
