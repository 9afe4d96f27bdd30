"""The engine's answer to a resync request: the cache's full state as events and batches,
and that kvmeta's index rebuilt from them equals the cache (pure, no Redis)."""

from __future__ import annotations

import random

import pytest
from tideserve.v1 import events_pb2

from services.common.engine_core.kvcache import KVCache, KVEventKind, KVEventRecord
from services.common.tokens import block_hashes
from services.engine.events import chunk_full_state, full_state_batches
from services.kvmeta.index import PrefixIndex, Verdict

BS = 4
STORED, CLEARED = KVEventKind.STORED, KVEventKind.ALL_CLEARED


def run_prompt(cache: KVCache, sid: str, tokens: list[int], tenant: str = "") -> list[int]:
    hashes = block_hashes(tokens, BS, tenant=tenant)
    alloc = cache.allocate(sid, hashes, len(hashes) + 1, tenant)
    assert alloc is not None
    cache.commit(sid, hashes)
    cache.release(sid)
    return hashes


def covered(records: list[KVEventRecord]) -> list[int]:
    return [h for r in records for h in r.block_hashes]


def test_full_state_orders_chains_parent_first_with_branches() -> None:
    cache = KVCache(64, BS)
    trunk = run_prompt(cache, "a", list(range(12)))  # 3 blocks
    branch = run_prompt(cache, "b", [*range(8), 100, 101, 102, 103])  # shares 2
    other = run_prompt(cache, "c", list(range(8)), tenant="acme")
    cache.drain_events()
    state = cache.full_state()
    assert state[0] == KVEventRecord(CLEARED)
    assert cache.outbox == []  # pure: nothing queued
    assert state[1:] == [
        KVEventRecord(STORED, tuple(trunk), 0, 3 * BS),
        KVEventRecord(STORED, (branch[2],), trunk[1], BS),
        KVEventRecord(STORED, tuple(other), 0, 2 * BS, "acme"),
    ]


def test_full_state_of_an_empty_cache_clears_only() -> None:
    assert KVCache(8, BS).full_state() == [KVEventRecord(CLEARED)]


REC = [
    KVEventRecord(CLEARED),
    KVEventRecord(STORED, (1, 2, 3, 4, 5), 0, 5 * BS),
    KVEventRecord(STORED, (6, 7), 3, 2 * BS, "t"),
]


@pytest.mark.parametrize(
    ("max_blocks", "expect"),
    [
        (100, [REC]),
        (
            3,
            [
                [REC[0], KVEventRecord(STORED, (1, 2), 0, 2 * BS)],
                [KVEventRecord(STORED, (3, 4, 5), 2, 3 * BS)],
                [REC[2]],
            ],
        ),
        (
            1,
            [[REC[0]]]
            + [[KVEventRecord(STORED, (h,), h - 1, BS)] for h in (1, 2, 3, 4, 5)]
            + [
                [KVEventRecord(STORED, (6,), 3, BS, "t")],
                [KVEventRecord(STORED, (7,), 6, BS, "t")],
            ],
        ),
    ],
    ids=["one-chunk", "run-split-keeps-parent", "one-block-per-chunk"],
)
def test_chunk_full_state(max_blocks: int, expect: list[list[KVEventRecord]]) -> None:
    chunks = chunk_full_state(REC, max_blocks)
    assert chunks == expect
    assert covered([r for c in chunks for r in c]) == covered(REC)


def test_full_state_batches_number_and_flag_the_chunks() -> None:
    batches = full_state_batches(
        REC,
        max_blocks=3,
        deployment="d",
        instance_id="i",
        epoch=7,
        first_seq=10,
        ts_ms=5,
        block_size=BS,
    )
    assert [(b.seq, b.full_state_continues) for b in batches] == [
        (10, True),
        (11, True),
        (12, False),
    ]
    assert batches[0].events[0].kind == events_pb2.KVEvent.KIND_ALL_CLEARED
    assert {(b.deployment, b.instance_id, b.epoch, b.block_size) for b in batches} == {
        ("d", "i", 7, BS)
    }


def index_blocks(idx: PrefixIndex, cache_hashes: dict[str, list[list[int]]]) -> dict[str, int]:
    """Matched blocks of instance "i" per chain, to compare with the cache's own match."""
    out = {}
    for tenant, chains in cache_hashes.items():
        for n, chain in enumerate(chains):
            got = {m.instance_id: m.matched_blocks for m in idx.match_prefix("d", tenant, chain)}
            out[f"{tenant}/{n}"] = got.get("i", 0)
    return out


@pytest.mark.parametrize(
    ("seed", "max_blocks"),
    [(1, 4096), (2, 3), (3, 1), (4, 7)],
    ids=["one-batch", "chunks-of-3", "chunks-of-1", "chunks-of-7"],
)
def test_index_rebuilt_from_full_state_equals_the_cache(seed: int, max_blocks: int) -> None:
    rng = random.Random(seed)
    cache = KVCache(48, BS)  # small: prompts evict each other
    idx = PrefixIndex()
    chains: dict[str, list[list[int]]] = {}
    seq = 0
    for n in range(40):
        tenant = rng.choice(["", "acme"])
        base = rng.randrange(4)
        tokens = [base * 1000 + t for t in range(rng.randrange(1, 6) * BS)]
        tokens += [rng.randrange(10**6) for _ in range(rng.randrange(0, 3) * BS)]
        chains.setdefault(tenant, []).append(run_prompt(cache, f"s{n}", tokens, tenant))
        events = cache.drain_events()
        if events:
            seq += 1
            if seq % 5 != 3:  # every fifth batch is lost: the index goes stale
                idx.apply_batch("d", "i", 1, seq, _proto(events), float(seq))
    assert idx.instances("d")[0].stale
    for b in full_state_batches(
        cache.full_state(),
        max_blocks=max_blocks,
        deployment="d",
        instance_id="i",
        epoch=1,
        first_seq=seq + 1,
        ts_ms=0,
        block_size=BS,
    ):
        outcome = idx.apply_batch("d", "i", b.epoch, b.seq, b.events, 0.0, b.full_state_continues)
        assert outcome is Verdict.APPLIED
    info = idx.instances("d")[0]
    assert not info.stale and not info.syncing
    assert info.blocks == sum(len(v) for v in cache.resident().values())
    expect = {
        f"{tenant}/{n}": cache.match(chain)
        for tenant, cs in chains.items()
        for n, chain in enumerate(cs)
    }
    assert index_blocks(idx, chains) == expect


def _proto(records: list[KVEventRecord]) -> list[events_pb2.KVEvent]:
    from services.engine.events import kv_batch

    return list(
        kv_batch(
            records, deployment="d", instance_id="i", epoch=1, seq=1, ts_ms=0, block_size=BS
        ).events
    )
