"""PendingPicks: per-instance totals of unanswered picks, settled or expired by TTL."""

from __future__ import annotations

import pytest

from services.common.routing.plugins.pending import PendingPicks

# (op, request id, instance, amount, now); op "add", "drop" or "expire"
Step = tuple[str, str, str, int, float]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ([("add", "r1", "a", 5, 0.0), ("add", "r2", "a", 3, 1.0)], {"a": 8}),
        ([("add", "r1", "a", 5, 0.0), ("drop", "r1", "", 0, 0.0)], {"a": 0}),
        ([("add", "r1", "a", 5, 0.0), ("drop", "r1", "", 0, 0.0), ("drop", "r1", "", 0, 0.0)],
         {"a": 0}),
        ([("add", "r1", "a", 5, 0.0), ("add", "r1", "b", 2, 1.0)], {"a": 0, "b": 2}),
        ([("add", "r1", "a", 5, 0.0), ("add", "r2", "b", 2, 10.5)], {"a": 0, "b": 2}),
        ([("add", "r1", "a", 5, 0.0), ("add", "r2", "b", 2, 10.0)], {"a": 5, "b": 2}),
        ([("add", "r1", "a", 5, 0.0), ("expire", "", "", 0, 11.0)], {"a": 0}),
        ([("drop", "nope", "", 0, 0.0)], {}),
    ],
    ids=["sum", "settled", "drop-idempotent", "re-pick-moves", "ttl-expires-on-add",
         "ttl-boundary-kept", "expire", "unknown-drop"],
)  # fmt: skip
def test_pending_picks(steps: list[Step], expected: dict[str, int]) -> None:
    p = PendingPicks(ttl_s=10.0)
    for op, rid, iid, amount, now in steps:
        if op == "add":
            p.add(rid, iid, amount, now)
        elif op == "drop":
            p.drop(rid)
        else:
            p.expire(now)
    assert p.totals == expected
