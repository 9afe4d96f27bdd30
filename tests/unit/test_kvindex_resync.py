"""The shared resync policy (services.common.kvindex.resync): which stale instances to ask
for a full state, with one outstanding request per instance and back-off."""

from __future__ import annotations

import pytest

from services.common.kvindex import (
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


@pytest.mark.parametrize(
    ("attempts", "wait"),
    [(0, 5.0), (1, 5.0), (2, 10.0), (3, 20.0), (4, 20.0), (30, 20.0)],
    ids=["zero", "first", "second", "third-at-cap", "capped", "many"],
)
def test_wait_doubles_up_to_the_cap(attempts: int, wait: float) -> None:
    assert POLICY.wait_s(attempts) == wait
