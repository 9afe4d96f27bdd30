"""KV cache prefetch (pure): slots reserved for blocks coming back from the tier count as
used, are found by evicting unprotected blocks only, and become cached blocks (resident,
protected, announced as one STORED run per chain run) when adopted, or are given back."""

from __future__ import annotations

import pytest

from services.common.engine_core.kvcache import KVCache, KVEventKind, KVEventRecord
from services.common.tokens import block_hashes

BS = 4
OLD, NEW, CHAIN = list(range(8)), list(range(100, 108)), list(range(300, 316))


def hashes(tokens: list[int]) -> list[int]:
    return block_hashes(tokens, BS)


def fill(cache: KVCache, seq: str, tokens: list[int]) -> None:
    hs = hashes(tokens)
    assert cache.allocate(seq, hs, cache.blocks_for(len(tokens))) is not None
    cache.commit(seq, hs)
    cache.release(seq)


def cache_of(capacity: int, *, hold: bool = False, protect_old: bool = False) -> KVCache:
    """OLD then NEW cached (2 blocks each, unreferenced); OLD protected when asked."""
    cache = KVCache(capacity_blocks=capacity, block_size=BS, hold_evicted=hold)
    fill(cache, "old", OLD)
    fill(cache, "new", NEW)
    if protect_old:
        cache.protect(hashes(OLD))
    cache.drain_events()
    cache.drain_filled()
    return cache


@pytest.mark.parametrize(
    ("capacity", "want", "hold", "protect_old", "got", "survivors", "held"),
    [
        (8, 4, False, False, True, {"OLD", "NEW"}, 0),
        (6, 4, False, False, True, {"NEW"}, 0),
        (6, 4, False, True, True, {"OLD"}, 0),
        (4, 4, False, True, False, {"OLD", "NEW"}, 0),
        (6, 4, True, False, False, {"NEW"}, 2),
    ],
    ids=[
        "free-room",
        "evicts-lru",
        "evicts-unprotected-only",
        "never-protected-refused",
        "offloading-waits-for-stores",
    ],
)
def test_reserve(
    capacity: int,
    want: int,
    hold: bool,
    protect_old: bool,
    got: bool,
    survivors: set[str],
    held: int,
) -> None:
    cache = cache_of(capacity, hold=hold, protect_old=protect_old)
    used = cache.used_blocks
    slots = cache.reserve(want)
    assert (slots is not None) == got
    chains = {"OLD": hashes(OLD), "NEW": hashes(NEW)}
    assert {n for n, hs in chains.items() if cache.match(hs) == 2} == survivors
    assert cache.held_slots == held
    if slots is not None:
        assert len(set(slots)) == want and cache.reserved_blocks == want
        assert cache.used_blocks == 4 - 2 * (2 - len(survivors)) + want
    else:
        assert cache.reserved_blocks == 0 and cache.used_blocks == used


def test_reserve_after_the_stores_end() -> None:
    cache = cache_of(6, hold=True)
    assert cache.reserve(4) is None  # OLD evicted, its slots held until stored
    cache.offloaded(cache.drain_evicted())
    assert cache.reserve(4) is not None


def test_adopt_makes_blocks_resident_protected_and_announced() -> None:
    cache = cache_of(8)
    chain = hashes(CHAIN)
    slots = cache.reserve(len(chain))
    assert slots is not None
    assert cache.adopt(list(zip(chain, slots, strict=True)), 0, "t") == 4
    assert cache.match(chain) == 4 and cache.reserved_blocks == 0
    assert cache.protected_blocks == 4 and cache.used_blocks == 8
    assert [cache.slot_of(h) for h in chain] == slots
    assert cache.drain_events() == [KVEventRecord(KVEventKind.STORED, tuple(chain), 0, 4 * BS, "t")]
    assert cache.drain_filled() == []  # the bytes arrived in the slots: nothing to write
    # a request then finds the prefix cached
    alloc = cache.allocate("r", chain, 5)
    assert alloc is not None and alloc.cached_blocks == 4


def test_adopt_skips_blocks_computed_meanwhile() -> None:
    cache = cache_of(12)
    chain = hashes(CHAIN)
    slots = cache.reserve(4)
    assert slots is not None
    fill(cache, "req", CHAIN[: 2 * BS])  # a request computed the first two blocks meanwhile
    cache.drain_events()
    assert cache.adopt(list(zip(chain, slots, strict=True)), 0) == 2
    assert cache.match(chain) == 4 and cache.reserved_blocks == 0
    assert cache.used_blocks == 4 + 4  # OLD, NEW, the chain; two spare slots given back
    (ev,) = cache.drain_events()
    assert (ev.block_hashes, ev.parent_hash) == (tuple(chain[2:]), chain[1])


def test_unreserve_gives_the_slots_back() -> None:
    cache = cache_of(8)
    slots = cache.reserve(4)
    assert slots is not None and cache.free_blocks == 0
    cache.unreserve(slots)
    assert cache.free_blocks == 4 and cache.reserved_blocks == 0


def test_adopted_blocks_evicted_leaf_first() -> None:
    cache = cache_of(8)
    chain = hashes(CHAIN)
    slots = cache.reserve(4)
    assert slots is not None
    cache.adopt(list(zip(chain, slots, strict=True)), 0)
    cache.unprotect()
    cache.drain_events()
    assert cache.allocate("x", [], 5) is not None  # OLD, NEW (oldest) then the chain's leaf
    assert cache.match(chain) == 3
