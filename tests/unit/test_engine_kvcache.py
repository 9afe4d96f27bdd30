"""Paged KV cache: prefix reuse, reference counts, LRU eviction, KV events."""

from __future__ import annotations

import random

import pytest

from services.common.engine_core.kvcache import KVCache, KVEventKind
from services.common.tokens import block_hashes

BS = 4


def hashes(tokens: list[int], tenant: str = "") -> list[int]:
    return block_hashes(tokens, BS, tenant=tenant)


def fill(cache: KVCache, seq: str, tokens: list[int], extra_blocks: int = 0) -> int:
    """Allocate, compute and release a prompt; returns its cached blocks at admission."""
    hs = hashes(tokens)
    alloc = cache.allocate(seq, hs, cache.blocks_for(len(tokens)) + extra_blocks)
    assert alloc is not None
    cache.commit(seq, hs)
    cache.release(seq)
    return alloc.cached_blocks


def test_repeated_prompt_hits_every_full_block_and_shares_them() -> None:
    cache = KVCache(capacity_blocks=16, block_size=BS)
    prompt = list(range(10))  # 2 full blocks + a partial one
    assert fill(cache, "a", prompt) == 0
    assert fill(cache, "b", prompt) == 2
    assert fill(cache, "c", prompt[:4] + [99] * 6) == 1  # diverges in block 2
    assert cache.hit_tokens == 3 * BS


def test_tenants_never_share_blocks() -> None:
    cache = KVCache(capacity_blocks=16, block_size=BS)
    prompt = list(range(8))
    alloc = cache.allocate("a", hashes(prompt, "t1"), 2, "t1")
    assert alloc is not None
    cache.commit("a", hashes(prompt, "t1"))
    cache.release("a")
    assert cache.match(hashes(prompt, "t2")) == 0 and cache.match(hashes(prompt, "t1")) == 2


def test_lru_evicts_oldest_unreferenced_and_leaf_first() -> None:
    cache = KVCache(capacity_blocks=4, block_size=BS)
    old, new = list(range(8)), list(range(100, 108))
    fill(cache, "old", old)
    fill(cache, "new", new)
    cache.drain_events()
    # Needs one block: the oldest chain's leaf (block 1 of "old") goes first.
    assert cache.allocate("x", [], 1) is not None
    (ev,) = cache.drain_events()
    assert ev.kind is KVEventKind.REMOVED and ev.block_hashes == (hashes(old)[1],)
    assert cache.match(hashes(old)) == 1 and cache.match(hashes(new)) == 2


def test_referenced_blocks_are_never_evicted() -> None:
    cache = KVCache(capacity_blocks=4, block_size=BS)
    prompt = list(range(8))
    fill(cache, "a", prompt)
    held = cache.allocate("b", hashes(prompt), 2)  # shares both cached blocks
    assert held is not None and held.cached_blocks == 2
    assert cache.allocate("c", [], 3) is None  # only 2 free, nothing evictable
    assert cache.allocate("c", [], 2) is not None
    assert cache.match(hashes(prompt)) == 2
    cache.release("b")
    assert cache.allocate("d", [], 2) is not None  # now the released chain is evicted
    assert cache.match(hashes(prompt)) == 0


@pytest.mark.parametrize(
    ("prompt_len", "stored_runs"),
    [(8, [2]), (10, [2]), (3, [])],
    ids=["two-full-blocks", "partial-tail-not-stored", "no-full-block"],
)
def test_commit_emits_stored_with_parent_chain(prompt_len: int, stored_runs: list[int]) -> None:
    cache = KVCache(capacity_blocks=8, block_size=BS)
    prompt = list(range(prompt_len))
    hs = hashes(prompt)
    assert cache.allocate("a", hs, cache.blocks_for(prompt_len)) is not None
    cache.commit("a", hs)
    events = cache.drain_events()
    assert [len(e.block_hashes) for e in events] == stored_runs
    for e in events:
        assert e.kind is KVEventKind.STORED and e.parent_hash == 0
        assert e.token_count == len(e.block_hashes) * BS


def test_extension_stores_only_new_blocks_with_the_prefix_as_parent() -> None:
    cache = KVCache(capacity_blocks=8, block_size=BS)
    fill(cache, "a", list(range(4)))
    cache.drain_events()
    longer = list(range(12))
    fill(cache, "b", longer)
    (ev,) = cache.drain_events()
    assert ev.block_hashes == tuple(hashes(longer)[1:]) and ev.parent_hash == hashes(longer)[0]


def test_clear_refused_while_held_then_emits_all_cleared() -> None:
    cache = KVCache(capacity_blocks=8, block_size=BS)
    fill(cache, "a", list(range(8)))
    assert cache.allocate("b", [], 1) is not None
    assert cache.clear() is False
    cache.release("b")
    cache.drain_events()
    assert cache.clear() is True
    assert [e.kind for e in cache.drain_events()] == [KVEventKind.ALL_CLEARED]
    assert cache.used_blocks == 0


def test_usage_counts_referenced_blocks_only() -> None:
    cache = KVCache(capacity_blocks=10, block_size=BS)
    fill(cache, "a", list(range(8)))
    assert cache.usage == 0.0 and cache.used_blocks == 2
    assert cache.allocate("b", [], 5) is not None
    assert cache.usage == pytest.approx(0.5)


def test_cached_blocks_get_distinct_slots_reused_after_eviction_and_clear() -> None:
    cache = KVCache(capacity_blocks=4, block_size=BS)
    old, new = list(range(8)), list(range(100, 108))
    fill(cache, "old", old)
    fill(cache, "old-again", old)  # shared, not committed twice
    assert cache.drain_filled() == [(hashes(old)[0], 0), (hashes(old)[1], 1)]
    fill(cache, "new", new)
    assert cache.drain_filled() == [(hashes(new)[0], 2), (hashes(new)[1], 3)]
    assert cache.allocate("x", [], 1) is not None  # evicts old's leaf: slot 1 is free
    assert cache.slot_of(hashes(old)[1]) is None and cache.slot_of(hashes(old)[0]) == 0
    cache.release("x")
    third = list(range(200, 204))
    fill(cache, "third", third)
    assert cache.drain_filled() == [(hashes(third)[0], 1)]
    assert cache.clear()
    assert [cache.slot_of(h) for h in hashes(new)] == [None, None]
    fill(cache, "after-clear", new)
    assert cache.drain_filled() == [(hashes(new)[0], 0), (hashes(new)[1], 1)]


@pytest.mark.parametrize(
    ("running", "shares", "fits"),
    [
        (None, False, True),  # no limit: the capacity
        (6, False, True),  # 4 running + 2 new = the limit
        (5, False, False),  # 4 running + 2 new > 5
        (5, True, False),  # 1 of the 2 is cached, unreferenced: referencing it counts
        (6, True, True),
    ],
    ids=["no-limit", "at-limit", "over-limit", "shared-counts", "shared-at-limit"],
)
def test_running_blocks_limit_the_batch_not_the_cache(
    running: int | None, shares: bool, fits: bool
) -> None:
    """A 32-block cache whose running sequences may hold ``running`` blocks, with 21 cached
    ones (more than the limit: the limit leaves the cache's room alone): one sequence holds
    4 blocks; another wants 2 (its first one cached when ``shares``)."""
    cache = KVCache(capacity_blocks=32, block_size=BS, running_blocks=running)
    shared = list(range(100, 100 + BS))
    fill(cache, "old", shared)
    for k in range(20):
        fill(cache, f"c{k}", list(range(1000 * k + 1000, 1000 * k + 1000 + BS)))
    assert cache.allocate("big", hashes(list(range(4 * BS))), 4) is not None
    tokens = (shared if shares else [7] * BS) + [8] * BS
    assert cache.fits(hashes(tokens), 2) is fits
    assert (cache.allocate("new", hashes(tokens), 2) is not None) is fits
    assert cache.used_blocks >= 21 + 4  # nothing cached was evicted for the limit


def test_running_blocks_must_fit_the_capacity() -> None:
    with pytest.raises(ValueError, match="running_blocks"):
        KVCache(capacity_blocks=8, block_size=BS, running_blocks=9)


class _PerBlockRelease(KVCache):
    """``release`` as a loop over the blocks (the reference the bulk release keeps to)."""

    def release(self, seq_id: str) -> None:
        alloc = self._seqs.pop(seq_id, None)
        if alloc is None:
            return
        self._private -= alloc.private
        held = alloc.shared + alloc.committed
        held.reverse()
        freed: list[int] = []
        for h in held:
            slot = self._blocks.get(h)
            if slot is None:
                continue
            self._refs[slot] -= 1
            if self._refs[slot] == 0:
                freed.append(h)
        self._lru.update(dict.fromkeys(freed))


@pytest.mark.parametrize("seed", [0, 1, 2], ids=["seed-0", "seed-1", "seed-2"])
def test_release_in_bulk_is_the_per_block_release(seed: int) -> None:
    rng = random.Random(seed)
    bulk, ref = KVCache(64, 4), _PerBlockRelease(64, 4)
    chains = [[c * 100 + i for i in range(1, rng.randrange(2, 12))] for c in range(6)]
    chains.append([7, 8, 7, 9])  # a repeated hash: the per-block path
    live: list[str] = []
    for k in range(300):
        if live and (rng.random() < 0.5 or len(live) > 5):
            seq = live.pop(rng.randrange(len(live)))
            bulk.release(seq)
            ref.release(seq)
        else:
            chain = rng.choice(chains)[: rng.randrange(1, 12)]
            seq = f"s{k}"
            a = bulk.allocate(seq, chain, len(chain) + 1)
            b = ref.allocate(seq, chain, len(chain) + 1)
            assert (a is None) == (b is None)
            if a is not None:
                bulk.commit(seq, chain)
                ref.commit(seq, chain)
                live.append(seq)
        assert list(bulk._lru) == list(ref._lru)
        assert bulk._refs == ref._refs and bulk._blocks == ref._blocks
        assert bulk.drain_events() == ref.drain_events()
