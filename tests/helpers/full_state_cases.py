"""The multi-batch full-state table, shared by the KV-index core's tests and kvmeta's (which
runs it through its own index and snapshot codec): one table, two indexes built on it."""

from __future__ import annotations

from services.common.kvindex import ALL_CLEARED, STORED, BlockEvent, Verdict
from services.common.tokens import block_hashes

APPLIED, DUP, GAP = Verdict.APPLIED, Verdict.DUPLICATE, Verdict.GAP
H = block_hashes(list(range(64)), 8)  # 8 chained blocks
FULL = BlockEvent(ALL_CLEARED)


def stored(hashes: list[int]) -> BlockEvent:
    return BlockEvent(STORED, hashes)


# Steps: (seq, events, continues) for instance "a" epoch 1 after seq 1 stored H[:2] and a gap
# at seq 3; expected verdict per step, then (stale, syncing, matched blocks of H).
MULTI_CASES = [
    ([(4, [FULL, stored(H[:5])], False)], [APPLIED], (False, False, 5)),
    (
        [(4, [FULL, stored(H[:3])], True), (5, [stored(H[3:6])], False)],
        [APPLIED, APPLIED],
        (False, False, 6),
    ),
    ([(4, [FULL, stored(H[:3])], True)], [APPLIED], (True, True, 0)),
    (
        [
            (4, [FULL, stored(H[:2])], True),
            (5, [stored(H[2:4])], True),
            (6, [stored(H[4:7])], False),
        ],
        [APPLIED] * 3,
        (False, False, 7),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (6, [stored(H[3:6])], False)],
        [APPLIED, GAP],
        (True, False, 0),
    ),
    (
        [
            (4, [FULL, stored(H[:3])], True),
            (6, [stored(H[3:6])], False),
            (7, [FULL, stored(H[:4])], False),
        ],
        [APPLIED, GAP, APPLIED],
        (False, False, 4),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (5, [stored(H[3:4])], True)],
        [APPLIED, APPLIED],
        (True, True, 0),
    ),
    (
        [(4, [FULL, stored(H[:3])], True), (4, [FULL, stored(H[:3])], True)],
        [APPLIED, DUP],
        (True, True, 0),
    ),
    ([(4, [stored(H[2:5])], False)], [APPLIED], (True, False, 0)),
]

MULTI_IDS = [
    "one-batch-full-state",
    "two-batches",
    "first-chunk-only-stays-stale",
    "three-batches",
    "gap-inside-full-state-needs-new-resync",
    "new-full-state-after-broken-one",
    "unfinished-full-state-stays-stale",
    "duplicate-chunk-skipped",
    "ordinary-batch-keeps-stale",
]
