"""A full state sent in several batches, through kvmeta's prefix index and its snapshot codec
(a restart mid full state resumes it). Which stale instances to ask, and the sequencing
contract itself, are tested with the shared core (tests/unit/test_kvindex_*.py)."""

from __future__ import annotations

import pytest

from services.kvmeta.index import BlockEvent, PrefixIndex, Verdict
from tests.helpers.full_state_cases import FULL, MULTI_CASES, MULTI_IDS, H, stored


@pytest.mark.parametrize(
    ("steps", "outcomes", "final"),
    MULTI_CASES,
    ids=MULTI_IDS,
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
