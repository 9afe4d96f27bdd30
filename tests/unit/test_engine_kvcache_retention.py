"""KV cache retention priority (pure): protected blocks (an idle session's prefix the
retention rule keeps) are evicted after every unprotected one, and to the tier when the engine
offloads on eviction."""

from __future__ import annotations

import pytest

from services.common.engine_core.kvcache import KVCache, KVEventKind
from services.common.tokens import block_hashes

BS = 4
# three released 2-block chains, oldest first: OLD, MID, NEW
OLD, MID, NEW = list(range(8)), list(range(100, 108)), list(range(200, 208))


def hashes(tokens: list[int]) -> list[int]:
    return block_hashes(tokens, BS)


def cache_of(hold: bool = False) -> KVCache:
    cache = KVCache(capacity_blocks=6, block_size=BS, hold_evicted=hold)
    for i, toks in enumerate((OLD, MID, NEW)):
        hs = hashes(toks)
        assert cache.allocate(f"s{i}", hs, 2) is not None
        cache.commit(f"s{i}", hs)
        cache.release(f"s{i}")
    cache.drain_events()
    return cache


@pytest.mark.parametrize(
    ("protect", "need", "survivors"),
    [
        ([], 2, {"MID", "NEW"}),  # plain LRU: the oldest chain goes
        (["OLD"], 2, {"OLD", "NEW"}),  # protected: the oldest unprotected goes instead
        (["OLD"], 4, {"OLD"}),  # every unprotected block goes before a protected one
        (["OLD", "MID"], 4, {"MID"}),  # under pressure protected ones go too, LRU among them
        (["OLD", "MID", "NEW"], 2, {"MID", "NEW"}),  # all protected: LRU again
    ],
    ids=["lru", "protected-kept", "unprotected-first", "pressure-lru-among-protected", "all"],
)
def test_protected_blocks_are_evicted_last(
    protect: list[str], need: int, survivors: set[str]
) -> None:
    cache = cache_of()
    chains = {"OLD": hashes(OLD), "MID": hashes(MID), "NEW": hashes(NEW)}
    for name in protect:
        assert cache.protect(chains[name]) == 2
    assert cache.allocate("x", [], need) is not None
    kept = {n for n, hs in chains.items() if cache.match(hs) == 2}
    assert kept == survivors
    assert cache.protected_blocks == sum(2 for n in protect if n in survivors)
    every = [h for hs in chains.values() for h in hs]
    assert cache.count_protected(every) == cache.protected_blocks
    assert cache.count_protected([12345]) == 0


def test_protected_blocks_go_to_the_tier_when_offloading() -> None:
    cache = cache_of(hold=True)
    cache.protect(hashes(OLD) + hashes(MID) + hashes(NEW))
    assert cache.allocate("x", [], 2) is None  # evicts two, waits for their offload
    assert [h for h, _ in cache.drain_evicted()] == hashes(OLD)[::-1]


def test_unprotect_and_clear_drop_the_marks() -> None:
    cache = cache_of()
    cache.protect(hashes(OLD))
    assert cache.protect([12345]) == 0  # not resident: nothing marked
    cache.unprotect(hashes(OLD)[:1])
    assert cache.protected_blocks == 1
    cache.unprotect()
    assert cache.protected_blocks == 0
    cache.protect(hashes(OLD))
    assert cache.clear()
    assert cache.protected_blocks == 0
    assert cache.drain_events()[-1].kind is KVEventKind.ALL_CLEARED
