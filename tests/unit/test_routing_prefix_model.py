"""The routed-prefix index against a straightforward reference model of its contract
(one LRU-ordered dict of (block hash, instance) -> last routed time) over random sequences
of inserts, retractions, removals, expiries and matches: same matches, created entries,
retraction counts and sizes, including LRU eviction, TTL expiry and stride."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

import pytest

from services.common.routing.plugins.routed_index import RoutedPrefixIndex


class Reference:
    """The straightforward model: one LRU-ordered (hash, instance) -> time dict."""

    def __init__(self, ttl_s: float, max_entries: int, stride: int = 1) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.stride = stride
        self._lru: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._by_hash: dict[int, dict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def _drop(self, key: tuple[int, str]) -> None:
        del self._lru[key]
        holders = self._by_hash[key[0]]
        del holders[key[1]]
        if not holders:
            del self._by_hash[key[0]]

    def expire(self, now: float) -> int:
        """Drop entries older than the TTL; returns how many."""
        cutoff = now - self.ttl_s
        n = 0
        while self._lru:
            key, t = next(iter(self._lru.items()))
            if t >= cutoff:
                break
            self._drop(key)
            n += 1
        return n

    def insert(self, hashes: Sequence[int], instance_id: str, now: float) -> list[tuple[int, str]]:
        """Record that ``hashes`` (a chain, parent first) were routed to ``instance_id``.
        Returns the entries this call created (not those it only refreshed)."""
        self.expire(now)
        created: list[tuple[int, str]] = []
        positions = list(range(self.stride - 1, len(hashes), self.stride))
        if self.stride > 1 and len(hashes) % self.stride:
            positions.append(len(hashes) - 1)  # the chain's tip
        for i in positions:
            key = (hashes[i], instance_id)
            if key in self._lru:
                self._lru.move_to_end(key)
            else:
                self._by_hash.setdefault(hashes[i], {})[instance_id] = None
                created.append(key)
            self._lru[key] = now
        while len(self._lru) > self.max_entries:
            self._drop(next(iter(self._lru)))
        return created

    def retract(self, keys: Sequence[tuple[int, str]], at: float) -> int:
        """Drop entries an insert at time ``at`` created, unless a later insert refreshed
        them (their time is no longer ``at``). Returns how many were dropped."""
        n = 0
        for key in keys:
            if self._lru.get(key) == at:
                self._drop(key)
                n += 1
        return n

    def match(self, hashes: Sequence[int], now: float) -> dict[str, int]:
        """Matched prefix length in blocks per instance (only instances with > 0)."""
        self.expire(now)
        out: dict[str, int] = {}
        alive: list[str] | None = None
        for i in range(self.stride - 1, len(hashes), self.stride):
            holders = self._by_hash.get(hashes[i])
            if not holders:
                break
            alive = list(holders) if alive is None else [x for x in alive if x in holders]
            if not alive:
                break
            for iid in alive:
                out[iid] = i + 1
        if self.stride > 1:  # a routed tip among the blocks after each strided match
            for iid in {i for _, i in self._lru}:
                k = out.get(iid, 0)
                for p in range(k, min(k + self.stride - 1, len(hashes))):
                    if (hashes[p], iid) in self._lru:
                        out[iid] = p + 1
        return out

    def remove_instance(self, instance_id: str) -> int:
        """Forget an instance (left the fleet or restarted with an empty cache)."""
        keys = [k for k in self._lru if k[1] == instance_id]
        for k in keys:
            self._drop(k)
        return len(keys)


CASES = [(ttl, cap, stride) for ttl in (5.0, 50.0) for cap in (5, 20, 10_000) for stride in (1, 3)]


@pytest.mark.parametrize(
    ("ttl", "cap", "stride"), CASES, ids=[f"ttl{t:g}-cap{c}-stride{s}" for t, c, s in CASES]
)
def test_index_matches_reference_model(ttl: float, cap: int, stride: int) -> None:
    for seed in range(25):
        rng = random.Random(seed)
        ref, idx = Reference(ttl, cap, stride), RoutedPrefixIndex(ttl, cap, stride)
        base = [rng.randrange(1 << 62) for _ in range(30)]
        chains = [
            tuple(base[:k])
            if rng.random() < 0.5
            else tuple(rng.randrange(1 << 62) for _ in range(k))
            for k in (rng.randrange(0, 14) for _ in range(8))
        ]
        now, created = 0.0, list[tuple[list[tuple[int, str]], float]]()
        for step in range(150):
            now += rng.choice([0.0, 0.5, 1.0, 3.0])
            op, iid, chain = rng.random(), rng.choice("abcde"), rng.choice(chains)
            where = (seed, step)
            if op < 0.5:
                got = idx.insert(chain, iid, now)
                assert got == ref.insert(chain, iid, now), where
                created.append((got, now))
            elif op < 0.6 and created:
                keys, at = rng.choice(created)
                assert idx.retract(keys, at) == ref.retract(keys, at), where
            elif op < 0.65:
                assert idx.remove_instance(iid) == ref.remove_instance(iid), where
            elif op < 0.7:
                assert idx.expire(now) == ref.expire(now), where
            else:
                query = chain[: rng.randrange(len(chain) + 1)] if rng.random() < 0.3 else chain
                assert idx.match(query, now) == ref.match(query, now), where
            assert len(idx) == len(ref), where
