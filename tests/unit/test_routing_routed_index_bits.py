"""The routed-prefix index's match reads many holders' bits at once: the same matches, in
the same order, as taking one bit at a time."""

from __future__ import annotations

import random
from itertools import accumulate, repeat
from operator import and_

import pytest

from services.common.kvindex.match import mask_drops
from services.common.routing.plugins.routed_index import RoutedPrefixIndex
from services.common.routing.plugins.routed_match import RoutedMatch
from services.common.routing.plugins.routed_match import set_bits as _set_bits


def one_at_a_time(x: int) -> list[int]:
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out


@pytest.mark.parametrize(
    "x",
    [0, 1, 0b1011, (1 << 999) | 5, (1 << 1000) - 1, sum(1 << i for i in range(0, 3000, 7))],
    ids=["zero", "one", "few", "far-apart", "a-thousand", "every-seventh"],
)
def test_set_bits_lowest_first(x: int) -> None:
    assert _set_bits(x) == one_at_a_time(x)


def reference_match(idx: RoutedPrefixIndex, hashes: list[int]) -> dict[str, int]:
    """The match as the index computed it one bit at a time (before reading bits in bulk)."""
    stride, masks, iids = idx.stride, idx._masks, idx._iids
    hs = hashes[stride - 1 :: stride] if stride > 1 else hashes
    acc = list(accumulate(map(masks.get, hs, repeat(0)), and_))
    out: dict[str, int] = {}
    for lost, j in mask_drops(acc):
        for b in one_at_a_time(lost):
            out[iids[b]] = j * stride
    if stride > 1:
        groups: dict[int, int] = {}
        for iid, k in out.items():
            groups[k] = groups.get(k, 0) | (1 << idx._slot_of[iid])
        matched = 0
        for bits in groups.values():
            matched |= bits
        groups[0] = groups.get(0, 0) | ~matched
        for k, bits in groups.items():
            for p in range(k, min(k + stride - 1, len(hashes))):
                for b in one_at_a_time(masks.get(hashes[p], 0) & bits):
                    out[iids[b]] = p + 1
    return out


@pytest.mark.parametrize("stride", [1, 4], ids=["every-block", "stride-4"])
@pytest.mark.parametrize("instances", [5, 300], ids=["few-holders", "many-holders"])
def test_match_is_the_one_bit_at_a_time_match(stride: int, instances: int) -> None:
    rng = random.Random(stride * 1000 + instances)
    idx = RoutedPrefixIndex(600.0, 1_000_000, stride)
    chains = [[0, *range(c * 100 + 1, c * 100 + 1 + rng.randrange(1, 40))] for c in range(20)]
    for t in range(instances * 3):
        chain = rng.choice(chains)
        idx.insert(chain[: rng.randrange(1, len(chain) + 1)], f"w-{rng.randrange(instances)}", t)
    for chain in chains:
        got = idx.match(chain, instances * 3.0)
        want = reference_match(idx, chain)
        assert list(got.items()) == list(want.items())
        lazy = idx.match(chain, instances * 3.0)  # read without building the dict first
        assert isinstance(lazy, RoutedMatch)
        assert bool(lazy) == bool(want)
        assert lazy.longest() == first_longest(want)
        for iid in [*idx._iids, "not-there"]:
            assert lazy.get(iid) == want.get(iid)
            assert lazy.get(iid, 0) == want.get(iid, 0)
            assert (iid in lazy) == (iid in want)
        assert lazy == want and len(lazy) == len(want)


def first_longest(d: dict[str, int]) -> tuple[str, int] | None:
    """The first instance with the greatest length, as the routing diagnostics read it."""
    if not d:
        return None
    top = max(d.values())
    return next((i, n) for i, n in d.items() if n == top)
