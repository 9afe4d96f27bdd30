"""The shared epoch/seq sequencer (services.common.kvindex.sequencer) and its use by
ChainIndex: duplicates, epochs, gaps, full states in one or several batches."""

from __future__ import annotations

import pytest

from services.common.kvindex import (
    REMOVED,
    BlockEvent,
    ChainIndex,
    SeqState,
    Step,
    Verdict,
    sequence,
)
from tests.helpers.full_state_cases import (
    APPLIED,
    DUP,
    FULL,
    GAP,
    MULTI_CASES,
    MULTI_IDS,
    H,
    stored,
)


def removed(hashes: list[int]) -> BlockEvent:
    return BlockEvent(REMOVED, hashes)


S = SeqState
# (state before, epoch, seq, full, continues) -> step
STEP_CASES = [
    (None, 1, 1, False, False, Step(APPLIED, S(1, 1))),
    (None, 1, 7, False, False, Step(GAP, S(1, 7, True))),
    (None, 1, 7, True, False, Step(APPLIED, S(1, 7))),
    (None, 1, 7, True, True, Step(APPLIED, S(1, 7, True, True))),
    (S(1, 3), 1, 4, False, False, Step(APPLIED, S(1, 4))),
    (S(1, 3), 1, 3, False, False, Step(DUP, S(1, 3))),
    (S(1, 3), 1, 2, True, False, Step(DUP, S(1, 3))),
    (S(2, 3), 1, 9, False, False, Step(DUP, S(2, 3))),
    (S(1, 3), 2, 1, False, False, Step(APPLIED, S(2, 1), reset=True)),
    (S(1, 3, True), 2, 2, False, False, Step(GAP, S(2, 2, True), reset=True)),
    (S(1, 3), 1, 5, False, False, Step(GAP, S(1, 5, True))),
    (S(1, 3, True), 1, 4, False, False, Step(APPLIED, S(1, 4, True))),
    (S(1, 3, True), 1, 9, True, False, Step(APPLIED, S(1, 9))),
    (S(1, 3, True, True), 1, 4, False, True, Step(APPLIED, S(1, 4, True, True))),
    (S(1, 3, True, True), 1, 4, False, False, Step(APPLIED, S(1, 4))),
    (S(1, 3, True, True), 1, 5, False, False, Step(GAP, S(1, 5, True))),
    (S(1, 3, True, True), 2, 1, False, False, Step(APPLIED, S(2, 1), reset=True)),
]


@pytest.mark.parametrize(
    ("before", "epoch", "seq", "full", "continues", "step"),
    STEP_CASES,
    ids=[
        "first-seen-seq-1",
        "first-seen-mid-stream-is-gap",
        "first-seen-full-state",
        "first-seen-full-state-continues",
        "contiguous",
        "same-seq-duplicate",
        "older-seq-full-duplicate",
        "older-epoch-duplicate",
        "newer-epoch-resets",
        "newer-epoch-gap",
        "gap-marks-stale",
        "in-order-keeps-stale",
        "full-state-heals",
        "full-state-goes-on",
        "full-state-last-batch-heals",
        "gap-inside-full-state",
        "newer-epoch-ends-full-state",
    ],
)
def test_sequence(
    before: SeqState | None, epoch: int, seq: int, full: bool, continues: bool, step: Step
) -> None:
    assert sequence(before, epoch, seq, full, continues) == step


# Each step: (instance, epoch, seq, events); expected verdicts per step and final lengths of H.
SEQ_CASES = [
    ([("a", 1, 1, [stored(H[:4])])], [APPLIED], {"a": 4}),
    ([("a", 1, 1, [stored(H[:4])]), ("a", 1, 1, [stored(H[:8])])], [APPLIED, DUP], {"a": 4}),
    ([("a", 1, 1, [stored(H[:4])]), ("a", 1, 2, [stored(H[4:6])])], [APPLIED] * 2, {"a": 6}),
    ([("a", 1, 1, [stored(H[:4])]), ("a", 2, 1, [stored(H[:2])])], [APPLIED] * 2, {"a": 2}),
    ([("a", 2, 1, [stored(H[:4])]), ("a", 1, 5, [stored(H[:8])])], [APPLIED, DUP], {"a": 4}),
    ([("a", 1, 1, [stored(H[:4])]), ("a", 1, 3, [stored(H[4:5])])], [APPLIED, GAP], {}),
    (
        [
            ("a", 1, 1, [stored(H[:4])]),
            ("a", 1, 3, [stored(H[4:5])]),
            ("a", 1, 4, [FULL, stored(H[:3])]),
        ],
        [APPLIED, GAP, APPLIED],
        {"a": 3},
    ),
    ([("a", 1, 7, [stored(H[:4])])], [GAP], {}),
    ([("a", 1, 1, [stored(H[:6])]), ("a", 1, 2, [removed(H[2:3])])], [APPLIED] * 2, {"a": 2}),
    ([("a", 1, 1, [stored(H[:6]), FULL, stored(H[:1])])], [APPLIED], {"a": 1}),
    (
        [("a", 1, 1, [stored(H[:6])]), ("b", 1, 1, [stored(H[:3])]), ("b", 1, 2, [removed(H)])],
        [APPLIED] * 3,
        {"a": 6},
    ),
]


@pytest.mark.parametrize(
    ("steps", "verdicts", "expect"),
    SEQ_CASES,
    ids=[
        "first-batch",
        "duplicate-seq-skipped",
        "contiguous",
        "new-epoch-resets",
        "old-epoch-skipped",
        "gap-marks-stale",
        "full-resync-clears-stale",
        "first-seen-mid-stream-is-gap",
        "removed-breaks-chain",
        "all-cleared-mid-batch",
        "remove-only-own-blocks",
    ],
)
def test_index_sequencing(
    steps: list[tuple[str, int, int, list[BlockEvent]]],
    verdicts: list[Verdict],
    expect: dict[str, int],
) -> None:
    idx = ChainIndex()
    got = [idx.apply(i, e, s, evs, now=1.0) for i, e, s, evs in steps]
    assert got == verdicts
    assert idx.lookup(H).lengths() == expect


@pytest.mark.parametrize(
    ("steps", "verdicts", "final"),
    MULTI_CASES,
    ids=MULTI_IDS,
)
def test_multi_batch_full_state(
    steps: list[tuple[int, list[BlockEvent], bool]],
    verdicts: list[Verdict],
    final: tuple[bool, bool, int],
) -> None:
    idx = ChainIndex()
    idx.apply("a", 1, 1, [stored(H[:2])], now=1.0)
    assert idx.apply("a", 1, 3, [stored(H[7:8])], now=1.0) is GAP
    got = [idx.apply("a", 1, seq, evs, more, now=2.0) for seq, evs, more in steps]
    assert got == verdicts
    info = idx.instances()[0]
    assert (info.stale, info.syncing, idx.lookup(H).lengths().get("a", 0)) == final


def test_new_epoch_ends_an_unfinished_full_state() -> None:
    idx = ChainIndex()
    idx.apply("a", 1, 4, [FULL, stored(H[:3])], True, now=1.0)
    assert idx.instances()[0].syncing
    assert idx.apply("a", 2, 1, [stored(H[:2])], now=2.0) is APPLIED
    info = idx.instances()[0]
    assert (info.stale, info.syncing, info.epoch, info.blocks) == (False, False, 2, 2)


def test_mark_stale_voids_matches_until_a_full_state() -> None:
    idx = ChainIndex()
    idx.apply("a", 1, 1, [stored(H[:3])], now=1.0)
    idx.apply("b", 1, 4, [FULL, stored(H[:2])], True, now=1.0)
    assert idx.mark_stale() == ["a", "b"]
    assert [(i.stale, i.syncing) for i in idx.instances()] == [(True, False), (True, False)]
    assert idx.lookup(H).lengths() == {}
    assert idx.apply("a", 1, 2, [FULL, stored(H[:1])], now=2.0) is APPLIED
    assert idx.lookup(H).lengths() == {"a": 1}
