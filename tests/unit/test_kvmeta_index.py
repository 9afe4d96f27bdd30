"""kvmeta's prefix index over the shared core: several deployments, InstanceMatch answers
(longest first, tiers by number), expiry, instance listing, snapshots. The core itself
(sequencing, matching, slots) is tested in tests/unit/test_kvindex_*.py."""

from __future__ import annotations

import pytest

from services.common.tokens import block_hashes
from services.kvmeta.index import (
    ALL_CLEARED,
    REMOVED,
    STORED,
    BlockEvent,
    PrefixIndex,
    UnknownDeploymentError,
    Verdict,
)

GPU, CPU, SSD = 1, 2, 3
H = block_hashes(list(range(64)), 8)  # 8 chained blocks, default tenant


def stored(hashes: list[int], tier: int = GPU, tenant: str = "") -> BlockEvent:
    return BlockEvent(STORED, hashes, tier, tenant)


def removed(hashes: list[int], tier: int = GPU, tenant: str = "") -> BlockEvent:
    return BlockEvent(REMOVED, hashes, tier, tenant)


def lengths(idx: PrefixIndex, hashes: list[int], tenant: str = "", **kw: object) -> dict[str, int]:
    return {m.instance_id: m.matched_blocks for m in idx.match_prefix("d", tenant, hashes, **kw)}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("events", "query", "expect_len", "expect_tiers"),
    [
        ([stored(H[:4])], H, 4, {GPU: 4}),
        ([stored(H[:2]), stored(H[2:5], CPU)], H, 5, {GPU: 2, CPU: 3}),
        ([stored(H[:3]), stored(H[:3], CPU), stored(H[3:4], SSD)], H, 4, {GPU: 3, CPU: 3, SSD: 1}),
        ([stored(H[:2]), stored(H[3:5], CPU)], H, 2, {GPU: 2}),
        ([stored(H[1:4])], H, 0, {}),
    ],
    ids=[
        "single-tier",
        "gpu-then-cpu",
        "copies-in-two-tiers",
        "hole-stops-chain",
        "no-first-block",
    ],
)
def test_tier_split(
    events: list[BlockEvent], query: list[int], expect_len: int, expect_tiers: dict[int, int]
) -> None:
    idx = PrefixIndex()
    idx.apply_batch("d", "a", 1, 1, events, 0.0)
    res = idx.match_prefix("d", "", query)
    if expect_len == 0:
        assert res == []
        return
    [m] = res
    assert m.tiers == expect_tiers
    assert m.matched_blocks == expect_len


def test_many_instances_sorted_longest_first_and_candidates() -> None:
    idx = PrefixIndex()
    for n in range(300):  # several holders per block: exercises pair and mask encodings
        idx.apply_batch("d", f"i{n:03d}", 1, 1, [stored(H[: 1 + n % 8])], 0.0)
    res = idx.match_prefix("d", "", H)
    assert [m.matched_blocks for m in res] == sorted((m.matched_blocks for m in res), reverse=True)
    assert len(res) == 300 and res[0].matched_blocks == 8
    got = lengths(idx, H, candidates=["i007", "i010", "nope"])
    assert got == {"i007": 8, "i010": 3}
    # remove from a shared block: holders fall back to the compact encodings
    for n in range(2, 300):
        idx.apply_batch("d", f"i{n:03d}", 1, 2, [removed(H[:1])], 0.0)
    assert lengths(idx, H) == {"i000": 1, "i001": 2}


def test_tenant_isolation() -> None:
    idx = PrefixIndex()
    ha = block_hashes(list(range(32)), 8, tenant="acme")
    idx.apply_batch("d", "a", 1, 1, [stored(ha, tenant="acme")], 0.0)
    assert lengths(idx, ha, tenant="acme") == {"a": 4}
    assert lengths(idx, ha, tenant="") == {}
    assert lengths(idx, ha, tenant="other") == {}


def test_unknown_deployment_raises_and_empty_query_is_empty() -> None:
    idx = PrefixIndex()
    with pytest.raises(UnknownDeploymentError):
        idx.match_prefix("nope", "", H)
    idx.apply_batch("d", "a", 1, 1, [stored(H)], 0.0)
    assert idx.match_prefix("d", "", []) == []


def test_drop_expire_and_compact_recycles_slots() -> None:
    idx = PrefixIndex(instance_timeout_s=15.0)
    idx.apply_batch("d", "a", 1, 1, [stored(H)], 10.0)
    idx.apply_batch("d", "b", 1, 1, [stored(H[:5])], 20.0)
    idx.apply_batch("d", "c", 1, 1, [stored(H[:2])], 0.0)
    idx.touch("d", "c", 25.0)
    assert PrefixIndex().expire(now=1e9) == []  # no timeout configured: never
    assert idx.expire(now=30.0) == [("d", "a")]
    assert lengths(idx, H) == {"b": 5, "c": 2}
    assert idx.drop_instance("d", "b") and not idx.drop_instance("d", "b")
    assert idx.compact() > 0
    idx.apply_batch("d", "e", 1, 1, [stored(H[:1])], 40.0)  # reuses a scrubbed slot
    assert lengths(idx, H) == {"c": 2, "e": 1}
    assert [i.instance_id for i in idx.instances("d")] == ["c", "e"]


def test_list_instances_counts_blocks_and_staleness() -> None:
    idx = PrefixIndex()
    idx.apply_batch("d", "a", 1, 1, [stored(H[:4]), stored(H[:2], CPU)], 5.0)
    idx.apply_batch("d", "a", 1, 2, [removed(H[3:4])], 6.0)
    idx.apply_batch("d", "b", 3, 9, [stored(H[:1])], 7.0)
    infos = {i.instance_id: i for i in idx.instances("d")}
    assert (infos["a"].blocks, infos["a"].last_seq, infos["a"].stale) == (5, 2, False)
    assert (infos["b"].epoch, infos["b"].stale, infos["b"].last_seen) == (3, True, 7.0)
    assert idx.stale_instances("d") == ["b"]


def test_snapshot_roundtrip_preserves_matches_and_sequencing() -> None:
    idx = PrefixIndex()
    for n in range(40):
        idx.apply_batch("d", f"i{n}", 1, 1, [stored(H[: 1 + n % 8], GPU if n % 3 else CPU)], n)
    idx.apply_batch("d", "i0", 1, 2, [BlockEvent(ALL_CLEARED)], 50.0)  # retired slot
    idx.apply_batch("d", "i5", 1, 9, [], 50.0)  # stale
    ha = block_hashes(list(range(16)), 8, tenant="t")
    idx.apply_batch("e", "x", 2, 1, [stored(ha, SSD, "t")], 1.0)
    again = PrefixIndex.restore(idx.snapshot())
    for dep, tenant, q in [("d", "", H), ("e", "t", ha)]:
        assert again.match_prefix(dep, tenant, q) == idx.match_prefix(dep, tenant, q)
    assert again.instances("d") == idx.instances("d")
    assert again.apply_batch("d", "i1", 1, 1, [stored(H)], 60.0) is Verdict.DUPLICATE
    assert again.entry_count() == idx.entry_count()


@pytest.mark.parametrize(
    "blob", [b"", b"garbage", b"x\x9c\x03\x00"], ids=["empty", "junk", "zlib-empty"]
)
def test_restore_rejects_corrupt_snapshot(blob: bytes) -> None:
    with pytest.raises(ValueError):
        PrefixIndex.restore(blob)


@pytest.mark.parametrize("n", [40, 300], ids=["plain-pairs", "packed-pairs"])
def test_snapshot_roundtrip_with_many_holders(n: int) -> None:
    idx = PrefixIndex()
    for k in range(n):
        idx.apply_batch("d", f"i{k:03d}", 1, 1, [stored(H[: 1 + k % 8])], 0.0)
    for k in range(2, n, 2):  # pairs and singles next to masks
        idx.apply_batch("d", f"i{k:03d}", 1, 2, [removed(H[:1])], 0.0)
    again = PrefixIndex.restore(idx.snapshot())
    assert again.match_prefix("d", "", H) == idx.match_prefix("d", "", H)
    assert again.entry_count() == idx.entry_count()


def test_snapshots_of_the_previous_holder_encoding_restore() -> None:
    """Before the shared core, a pair of low slots was stored packed and singles as ``~s``:
    restored, they match as before (and in the canonical encoding)."""
    from services.common.kvindex import SeqState
    from services.common.kvindex.slots import PAIR_BASE, IndexState, InstState, slot_bit
    from services.kvmeta.index_codec import compress_snapshot, encode

    st = IndexState(next_slot=3)
    for s, iid in enumerate(["a", "b", "c"]):
        st.instances[iid] = st.owners[s] = InstState(iid, s, SeqState(1, 1), 0.0, 0)
        st.live |= 1 << s
    st.spaces[("", "")] = {GPU: {H[0]: 0b111, H[1]: -(PAIR_BASE + (0 << 16 | 2)), H[2]: ~0}}
    for iid, blocks in [("a", 3), ("b", 1), ("c", 2)]:
        st.instances[iid].blocks = blocks
    idx = PrefixIndex.restore(compress_snapshot(encode({"d": st})))
    assert lengths(idx, H) == {"a": 3, "b": 1, "c": 2}
    table = idx._deps["d"].state.spaces[("", "")][GPU]
    assert table == {H[0]: 0b111, H[1]: 0b101, H[2]: 0b1}
    assert table[H[2]] is slot_bit(0)  # singles are the shared objects again
    again = PrefixIndex.restore(idx.snapshot())
    assert again._deps["d"].state.spaces == idx._deps["d"].state.spaces
