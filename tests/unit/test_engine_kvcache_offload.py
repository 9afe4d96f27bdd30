"""KV cache offload on eviction (pure): an evicted block's slot is held with its bytes, and
counts as used, until the shell has stored it in the tier (``offloaded``); an allocation short
of free blocks evicts what it needs and waits for those offloads."""

from __future__ import annotations

import pytest

from services.common.engine_core.kvcache import KVCache
from services.common.tokens import block_hashes

BS = 4
OLD, NEW, X = list(range(8)), list(range(100, 108)), list(range(200, 208))


def hashes(tokens: list[int]) -> list[int]:
    return block_hashes(tokens, BS)


def fill(cache: KVCache, seq: str, tokens: list[int]) -> None:
    hs = hashes(tokens)
    assert cache.allocate(seq, hs, cache.blocks_for(len(tokens))) is not None
    cache.commit(seq, hs)
    cache.release(seq)


def full_cache(hold: bool) -> tuple[KVCache, dict[int, int]]:
    """Capacity 4 holding OLD and NEW (2 blocks each, unreferenced); their slots by hash."""
    cache = KVCache(capacity_blocks=4, block_size=BS, hold_evicted=hold)
    fill(cache, "old", OLD)
    fill(cache, "new", NEW)
    return cache, dict(cache.drain_filled())


@pytest.mark.parametrize(
    ("hold", "admitted", "evicted", "used"),
    [(False, True, 0, 4), (True, False, 2, 4)],
    ids=["no-tier-slots-freed-admitted", "offload-slots-held-admission-waits"],
)
def test_eviction_frees_or_holds_slots(hold: bool, admitted: bool, evicted: int, used: int) -> None:
    cache, slots = full_cache(hold)
    alloc = cache.allocate("x", hashes(X), 2)  # needs both OLD blocks (leaf first)
    assert (alloc is not None) is admitted
    pairs = cache.drain_evicted()
    old = hashes(OLD)
    assert pairs == [(old[1], slots[old[1]]), (old[0], slots[old[0]])][:evicted]
    assert cache.held_slots == evicted and cache.used_blocks == used
    assert cache.match(old) == 0  # evicted either way: no longer a prefix hit
    assert cache.drain_evicted() == []  # drained once


@pytest.mark.parametrize(
    ("stored", "admitted"),
    [(0, False), (1, False), (2, True)],
    ids=["none-stored-waits", "one-stored-still-waits", "both-stored-admitted"],
)
def test_admission_goes_once_the_evicted_blocks_are_stored(stored: int, admitted: bool) -> None:
    cache, _ = full_cache(True)
    assert cache.allocate("x", hashes(X), 2) is None
    pairs = cache.drain_evicted()
    cache.offloaded(pairs[:stored])
    assert (cache.allocate("x", hashes(X), 2) is not None) is admitted
    assert cache.drain_evicted() == []  # the retry evicts nothing more (NEW stays)
    assert cache.match(hashes(NEW)) == 2


def test_offloaded_is_idempotent_and_freed_slots_are_reused() -> None:
    cache, _ = full_cache(True)
    assert cache.allocate("x", [], 1) is None  # evicts OLD's leaf
    (pair,) = cache.drain_evicted()
    cache.offloaded([pair])
    cache.offloaded([pair])  # twice: a no-op
    assert cache.held_slots == 0
    fill(cache, "x", X[:4])
    assert cache.drain_filled() == [(hashes(X[:4])[0], pair[1])]


@pytest.mark.parametrize(
    ("prompt", "total", "evicted"),
    [(OLD, 3, 1), (X, 5, 0)],
    ids=["matched-prefix-not-evicted", "never-fits-nothing-evicted"],
)
def test_allocation_evicts_only_what_can_help(prompt: list[int], total: int, evicted: int) -> None:
    cache, _ = full_cache(True)
    assert cache.allocate("x", hashes(prompt), total) is None
    got = cache.drain_evicted()
    assert len(got) == evicted
    assert not {h for h, _ in got} & set(hashes(prompt))
