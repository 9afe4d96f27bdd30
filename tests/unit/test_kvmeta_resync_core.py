"""Resync in kvmeta's cores: which stale instances to ask (rate limit, backoff) and how a
full state sent in several batches is applied by the prefix index."""

from __future__ import annotations

import pytest

from services.common.tokens import block_hashes
from services.kvmeta.index import ALL_CLEARED, STORED, BlockEvent, Outcome, PrefixIndex
from services.kvmeta.resync import (
    Outstanding,
    ResyncPlan,
    ResyncPolicy,
    StaleInstance,
    plan_resyncs,
)

POLICY = ResyncPolicy(retry_after_s=5.0, max_retry_after_s=20.0)
A, B = StaleInstance("d", "a", 1), StaleInstance("d", "b", 1)

# (stale now, outstanding before, now) -> (asked, outstanding after)
PLAN_CASES = [
    ([A], {}, 100.0, [A], {A.key: Outstanding(1, 100.0, 1)}),
    ([A], {A.key: Outstanding(1, 100.0, 1)}, 104.9, [], {A.key: Outstanding(1, 100.0, 1)}),
    ([A], {A.key: Outstanding(1, 100.0, 1)}, 105.0, [A], {A.key: Outstanding(1, 105.0, 2)}),
    ([A], {A.key: Outstanding(1, 100.0, 2)}, 109.0, [], {A.key: Outstanding(1, 100.0, 2)}),
    ([A], {A.key: Outstanding(1, 100.0, 2)}, 110.0, [A], {A.key: Outstanding(1, 110.0, 3)}),
    ([A], {A.key: Outstanding(1, 100.0, 9)}, 120.0, [A], {A.key: Outstanding(1, 120.0, 10)}),
    ([], {A.key: Outstanding(1, 100.0, 1)}, 101.0, [], {}),
    (
        [StaleInstance("d", "a", 2)],
        {A.key: Outstanding(1, 100.0, 1)},
        101.0,
        [StaleInstance("d", "a", 2)],
        {A.key: Outstanding(2, 101.0, 1)},
    ),
    (
        [B, A],
        {A.key: Outstanding(1, 100.0, 1)},
        101.0,
        [B],
        {A.key: Outstanding(1, 100.0, 1), B.key: Outstanding(1, 101.0, 1)},
    ),
    (
        [StaleInstance("e", "a", 1), A],
        {},
        0.0,
        [A, StaleInstance("e", "a", 1)],
        {A.key: Outstanding(1, 0.0, 1), ("e", "a"): Outstanding(1, 0.0, 1)},
    ),
]


@pytest.mark.parametrize(
    ("stale", "before", "now", "asked", "after"),
    PLAN_CASES,
    ids=[
        "new-stale-asked-at-once",
        "one-outstanding-no-repeat",
        "retry-after-timeout",
        "backoff-doubles",
        "second-retry-after-double",
        "backoff-capped",
        "answered-forgotten",
        "new-epoch-asked-at-once",
        "only-the-new-one",
        "per-deployment-sorted",
    ],
)
def test_plan_resyncs(
    stale: list[StaleInstance],
    before: dict[tuple[str, str], Outstanding],
    now: float,
    asked: list[StaleInstance],
    after: dict[tuple[str, str], Outstanding],
) -> None:
    frozen = dict(before)
    assert plan_resyncs(stale, before, now, POLICY) == ResyncPlan(asked, after)
    assert before == frozen  # pure: the input map is not modified


@pytest.mark.parametrize(
    ("retry", "cap"), [(0.0, 1.0), (5.0, 4.0), (-1.0, 5.0)], ids=["zero", "cap-below", "negative"]
)
def test_policy_rejects_bad_timeouts(retry: float, cap: float) -> None:
    with pytest.raises(ValueError, match="retry_after_s"):
        ResyncPolicy(retry, cap)


H = block_hashes(list(range(64)), 8)  # 8 chained blocks


def stored(hashes: list[int]) -> BlockEvent:
    return BlockEvent(STORED, hashes)


FULL = BlockEvent(ALL_CLEARED)

# Steps: (seq, events, continues) for instance "a" epoch 1 after seq 1 stored H[:2] and a gap
# at seq 3; expected outcome per step, then (stale, syncing, matched blocks of H).
MULTI_CASES = [
    ([(4, [FULL, stored(H[:5])], False)], [Outcome.APPLIED], (False, False, 5)),
    (
        [(4, [FULL, stored(H[:3])], True), (5, [stored(H[3:6])], False)],
        [Outcome.APPLIED, Outcome.APPLIED],
        (False, False, 6),
    ),
    ([(4, [FULL, stored(H[:3])], True)], [Outcome.APPLIED], (True, True, 0)),
    (
        [
            (4, [FULL, stored(H[:2])], True),
            (5, [stored(H[2:4])], True),
            (6, [stored(H[4:7])], False),
        ],
        [Outcome.APPLIED] * 3,
        (False, False, 7),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (6, [stored(H[3:6])], False)],
        [Outcome.APPLIED, Outcome.RESYNC_NEEDED],
        (True, False, 0),
    ),
    (
        [
            (4, [FULL, stored(H[:3])], True),
            (6, [stored(H[3:6])], False),
            (7, [FULL, stored(H[:4])], False),
        ],
        [Outcome.APPLIED, Outcome.RESYNC_NEEDED, Outcome.APPLIED],
        (False, False, 4),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (5, [stored(H[3:4])], True)],
        [Outcome.APPLIED, Outcome.APPLIED],
        (True, True, 0),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (4, [FULL, stored(H[:3])], True)],
        [Outcome.APPLIED, Outcome.SKIPPED],
        (True, True, 0),
    ),
    ([(4, [stored(H[2:5])], False)], [Outcome.APPLIED], (True, False, 0)),
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
    outcomes: list[Outcome],
    final: tuple[bool, bool, int],
) -> None:
    idx = PrefixIndex()
    idx.apply_batch("d", "a", 1, 1, [stored(H[:2])], 1.0)
    assert idx.apply_batch("d", "a", 1, 3, [stored(H[7:8])], 1.0) is Outcome.RESYNC_NEEDED
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
    assert idx.apply_batch("d", "a", 2, 1, [stored(H[:2])], 2.0) is Outcome.APPLIED
    info = idx.instances("d")[0]
    assert (info.stale, info.syncing, info.epoch, info.blocks) == (False, False, 2, 2)
