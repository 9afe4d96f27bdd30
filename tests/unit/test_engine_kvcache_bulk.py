"""The KV cache's bulk eviction and a cache that records nothing keep the per-block
behaviour: the same blocks, slots, reference counts and LRU order."""

from __future__ import annotations

import random

import pytest

from services.common.engine_core.kvcache import KVCache, KVEventKind, KVEventRecord


class _PerBlockEvict(KVCache):
    """``_remove`` as a loop over the victims, a slot given back at a time (the reference)."""

    def _remove(self, victims: list[int]) -> None:
        removed: list[int] = []
        for h in victims:
            del self._lru[h]
            self._protected.discard(h)
            slot = self._blocks.pop(h)
            if self.hold_evicted:
                self._held[slot] = h
                self._evicted.append((h, slot))
            else:
                self._slots.give([slot])
            removed.append(h)
        if removed:
            self.outbox.append(
                KVEventRecord(
                    KVEventKind.REMOVED, tuple(removed), 0, len(removed) * self.block_size
                )
            )


def _state(c: KVCache) -> tuple[object, ...]:
    slots = {h: c.slot_of(h) for h in c._blocks}
    return (list(c._lru), slots, c._refs, c.free_blocks, c.usage, sorted(c._protected))


@pytest.mark.parametrize("seed", [0, 1, 2, 3], ids=["seed-0", "seed-1", "seed-2", "seed-3"])
def test_bulk_eviction_and_no_records_keep_the_per_block_cache(seed: int) -> None:
    rng = random.Random(seed)
    caches = [_PerBlockEvict(48, 4), KVCache(48, 4), KVCache(48, 4, record=False)]
    chains = [[c * 100 + i for i in range(1, rng.randrange(3, 20))] for c in range(10)]
    live: list[str] = []
    for k in range(400):
        op = rng.random()
        if live and (op < 0.45 or len(live) > 3):
            seq = live.pop(rng.randrange(len(live)))
            for c in caches:
                c.release(seq)
        elif op < 0.5:
            chain = rng.choice(chains)
            some = chain[: rng.randrange(len(chain))]
            for c in caches:
                c.protect(some) if k % 2 else c.unprotect()
        elif op < 0.55:
            chain = rng.choice(chains)
            assert len({c.evict_now(chain[::2]) for c in caches}) == 1
        else:
            chain = rng.choice(chains)[: rng.randrange(1, 20)]
            seq = f"s{k}"
            total = len(chain) + rng.randrange(3)
            got = [c.allocate(seq, chain, total) for c in caches]
            assert len({a is None for a in got}) == 1
            if got[0] is not None:
                for c in caches:
                    c.commit(seq, chain)
                live.append(seq)
        assert _state(caches[0]) == _state(caches[1]) == _state(caches[2])
        assert caches[0].drain_events() == caches[1].drain_events()
        assert caches[0].drain_filled() == caches[1].drain_filled()
    assert caches[2].drain_events() == [] and caches[2].drain_filled() == []
