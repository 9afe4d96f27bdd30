"""The shared chain match and slot storage (services.common.kvindex.match / .slots): tiers,
namespaces, candidates, holder encodings, dropping and compaction."""

from __future__ import annotations

import pytest

from services.common.kvindex import ALL_CLEARED, REMOVED, STORED, BlockEvent, ChainIndex
from services.common.kvindex.slots import (
    PACK_FROM,
    PAIR_BASE,
    holder_from_mask,
    holder_mask,
    slot_bit,
)
from services.common.tokens import block_hashes

GPU, CPU, SSD = 1, 2, 3
H = block_hashes(list(range(64)), 8)  # 8 chained blocks, default tenant


def stored(hashes: list[int], tier: int = GPU, tenant: str = "", lora: str = "") -> BlockEvent:
    return BlockEvent(STORED, hashes, tier, tenant, lora)


def removed(hashes: list[int], tier: int = GPU) -> BlockEvent:
    return BlockEvent(REMOVED, hashes, tier)


@pytest.mark.parametrize(
    ("events", "expect_len", "expect_tiers"),
    [
        ([stored(H[:4])], 4, {GPU: 4}),
        ([stored(H[:4], 0)], 4, {GPU: 4}),
        ([stored(H[:2]), stored(H[2:5], CPU)], 5, {GPU: 2, CPU: 3}),
        ([stored(H[:3]), stored(H[:3], CPU), stored(H[3:4], SSD)], 4, {GPU: 3, CPU: 3, SSD: 1}),
        ([stored(H[:2]), stored(H[3:5], CPU)], 2, {GPU: 2}),
        ([stored(H[1:4])], 0, {}),
    ],
    ids=[
        "single-tier",
        "tier-0-is-gpu",
        "gpu-then-cpu",
        "copies-in-two-tiers",
        "hole-stops-chain",
        "no-first-block",
    ],
)
def test_tier_split(
    events: list[BlockEvent], expect_len: int, expect_tiers: dict[int, int]
) -> None:
    idx = ChainIndex()
    idx.apply("a", 1, 1, events, now=0.0)
    m = idx.lookup(H)
    assert m.lengths() == ({"a": expect_len} if expect_len else {})
    if not expect_len:
        return
    got = {m.tier: expect_len} if m.tier else dict(m.tiers["a"])
    assert got == expect_tiers


@pytest.mark.parametrize(
    ("tenant", "lora", "expect"),
    [("acme", "", {"a": 4}), ("", "", {}), ("other", "", {}), ("acme", "l1", {"b": 2})],
    ids=["own-namespace", "default-tenant", "other-tenant", "lora-namespace"],
)
def test_namespaces_are_isolated(tenant: str, lora: str, expect: dict[str, int]) -> None:
    ha = block_hashes(list(range(32)), 8, tenant="acme")
    idx = ChainIndex()
    idx.apply("a", 1, 1, [stored(ha, tenant="acme")], now=0.0)
    idx.apply("b", 1, 1, [stored(ha[:2], tenant="acme", lora="l1")], now=0.0)
    assert idx.lookup(ha, tenant, lora).lengths() == expect


@pytest.mark.parametrize("n", [3, 64, 65, 300], ids=["few", "one-word", "past-pack", "many"])
def test_many_holders_runs_and_candidates(n: int) -> None:
    """Several holders per block (single, pair, packed pair and mask encodings)."""
    idx = ChainIndex()
    for k in range(n):
        idx.apply(f"i{k:03d}", 1, 1, [stored(H[: 1 + k % 8])], now=0.0)
    m = idx.lookup(H)
    assert [k for _, k in m.runs] == sorted({1 + k % 8 for k in range(n)})
    assert m.lengths() == {f"i{k:03d}": 1 + k % 8 for k in range(n)}
    cands = ["i000", "i001", "nope"]
    assert idx.lookup(H, candidates=cands).lengths() == {"i000": 1, "i001": 2}
    for k in range(2, n):  # holders fall back to the compact encodings
        idx.apply(f"i{k:03d}", 1, 2, [removed(H[:1])], now=0.0)
    assert idx.lookup(H).lengths() == {"i000": 1, "i001": 2}
    assert idx.entry_count() == sum(1 + k % 8 for k in range(n)) - (n - 2)


def test_empty_queries() -> None:
    idx = ChainIndex()
    assert idx.lookup(H).runs == ()
    idx.apply("a", 1, 1, [stored(H)], now=0.0)
    assert idx.lookup([]).runs == ()
    assert idx.lookup(H, candidates=[]).runs == ()


def test_drop_and_compact_recycle_slots() -> None:
    idx = ChainIndex()
    idx.apply("a", 1, 1, [stored(H)], now=0.0)
    idx.apply("b", 1, 1, [stored(H[:5])], now=0.0)
    idx.apply("c", 1, 1, [stored(H[:2])], now=0.0)
    assert idx.drop("b") and not idx.drop("b")
    idx.apply("a", 1, 2, [BlockEvent(ALL_CLEARED), stored(H[:3])], now=0.0)  # a's old slot retired
    assert idx.retired_slots == 2
    before = idx.lookup(H).lengths()
    assert before == {"a": 3, "c": 2}
    assert idx.compact() > 0 and idx.retired_slots == 0 and idx.compact() == 0
    assert idx.lookup(H).lengths() == before
    idx.apply("e", 1, 1, [stored(H[:1])], now=0.0)  # reuses a scrubbed slot: no stale bit leaks
    assert idx.lookup(H).lengths() == {"a": 3, "c": 2, "e": 1}
    assert idx.entry_count() == 3 + 2 + 1


def test_touch_and_last_seen_only_move_forward() -> None:
    idx = ChainIndex()
    idx.apply("a", 1, 1, [stored(H[:1])], now=10.0)
    idx.touch("a", 5.0)
    idx.touch("nope", 5.0)
    assert idx.instances()[0].last_seen == 10.0
    idx.touch("a", 20.0)
    assert idx.instances()[0].last_seen == 20.0


@pytest.mark.parametrize(
    "slots",
    [(), (0,), (5,), (300,), (0, 1), (3, PACK_FROM - 1), (3, PACK_FROM), (70, 900), (1, 2, 3)],
    ids=["empty", "slot-0", "single", "single-high", "pair", "pair-below-pack", "pair-packed",
         "pair-high", "three"],
)  # fmt: skip
def test_holder_encoding_round_trips(slots: tuple[int, ...]) -> None:
    mask = sum(1 << s for s in slots)
    v = holder_from_mask(mask)
    if not slots:
        assert v is None
        return
    assert v is not None and holder_mask(v) == mask
    packed = len(slots) == 2 and max(slots) >= PACK_FROM
    assert (v <= -PAIR_BASE) == packed
    if len(slots) == 1:
        assert v is slot_bit(slots[0])  # one shared object per slot
