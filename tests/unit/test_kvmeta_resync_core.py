"""A full state sent in several batches, through kvmeta's prefix index and its snapshot codec
(a restart mid full state resumes it). Which stale instances to ask, and the sequencing
contract itself, are tested with the shared core (tests/unit/test_kvindex_*.py)."""

from __future__ import annotations

import pytest

from services.common.tokens import block_hashes
from services.kvmeta.index import ALL_CLEARED, STORED, BlockEvent, PrefixIndex, Verdict

H = block_hashes(list(range(64)), 8)  # 8 chained blocks


def stored(hashes: list[int]) -> BlockEvent:
    return BlockEvent(STORED, hashes)


FULL = BlockEvent(ALL_CLEARED)

# Steps: (seq, events, continues) for instance "a" epoch 1 after seq 1 stored H[:2] and a gap
# at seq 3; expected outcome per step, then (stale, syncing, matched blocks of H).
MULTI_CASES = [
    ([(4, [FULL, stored(H[:5])], False)], [Verdict.APPLIED], (False, False, 5)),
    (
        [(4, [FULL, stored(H[:3])], True), (5, [stored(H[3:6])], False)],
        [Verdict.APPLIED, Verdict.APPLIED],
        (False, False, 6),
    ),
    ([(4, [FULL, stored(H[:3])], True)], [Verdict.APPLIED], (True, True, 0)),
    (
        [
            (4, [FULL, stored(H[:2])], True),
            (5, [stored(H[2:4])], True),
            (6, [stored(H[4:7])], False),
        ],
        [Verdict.APPLIED] * 3,
        (False, False, 7),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (6, [stored(H[3:6])], False)],
        [Verdict.APPLIED, Verdict.GAP],
        (True, False, 0),
    ),
    (
        [
            (4, [FULL, stored(H[:3])], True),
            (6, [stored(H[3:6])], False),
            (7, [FULL, stored(H[:4])], False),
        ],
        [Verdict.APPLIED, Verdict.GAP, Verdict.APPLIED],
        (False, False, 4),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (5, [stored(H[3:4])], True)],
        [Verdict.APPLIED, Verdict.APPLIED],
        (True, True, 0),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (4, [FULL, stored(H[:3])], True)],
        [Verdict.APPLIED, Verdict.DUPLICATE],
        (True, True, 0),
    ),
    ([(4, [stored(H[2:5])], False)], [Verdict.APPLIED], (True, False, 0)),
]


@pytest.mark.parametrize(
    ("steps", "outcomes", "final"),
    MULTI_CASES,
    ids=[
        "one-batch-full-state",
        "two-batches",
        "first-chunk-only-stays-stale",
        "three-batches",
        "gap-inside-full-state-needs-new-resync",
        "new-full-state-after-broken-one",
        "unfinished-full-state-stays-stale",
        "duplicate-chunk-skipped",
        "ordinary-batch-keeps-stale",
    ],
)
def test_multi_batch_full_state(
    steps: list[tuple[int, list[BlockEvent], bool]],
    outcomes: list[Verdict],
    final: tuple[bool, bool, int],
) -> None:
    idx = PrefixIndex()
    idx.apply_batch("d", "a", 1, 1, [stored(H[:2])], 1.0)
    assert idx.apply_batch("d", "a", 1, 3, [stored(H[7:8])], 1.0) is Verdict.GAP
    got = [idx.apply_batch("d", "a", 1, seq, evs, 2.0, more) for seq, evs, more in steps]
    assert got == outcomes
    info = idx.instances("d")[0]
    matched = {m.instance_id: m.matched_blocks for m in idx.match_prefix("d", "", H)}
    assert (info.stale, info.syncing, matched.get("a", 0)) == final
    # the snapshot codec keeps both flags (a restart mid full state resumes it)
    again = PrefixIndex.restore(idx.snapshot()).instances("d")[0]
    assert (again.stale, again.syncing, again.blocks) == (info.stale, info.syncing, info.blocks)


def test_new_epoch_ends_an_unfinished_full_state() -> None:
    idx = PrefixIndex()
    idx.apply_batch("d", "a", 1, 4, [FULL, stored(H[:3])], 1.0, True)
    assert idx.instances("d")[0].syncing
    assert idx.apply_batch("d", "a", 2, 1, [stored(H[:2])], 2.0) is Verdict.APPLIED
    info = idx.instances("d")[0]
    assert (info.stale, info.syncing, info.epoch, info.blocks) == (False, False, 2, 2)
