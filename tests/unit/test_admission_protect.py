"""Protection in the dispatch order (services.common.admission.protect): a request that
cannot meet its TTFT deadline waits while its instance serves one that still can."""

from __future__ import annotations

import pytest

from services.common.admission.shaper import DispatchShaper
from services.common.admission.shaper_config import ShaperConfig


def shaper(protect: bool = True, slack: bool = False) -> DispatchShaper:
    s = DispatchShaper(
        ShaperConfig(hold_above_ms=150.0, order="slo", protect=protect, protect_slack=slack)
    )
    # a guard: can still meet its deadline (2.0 s) with its 300 ms prefill; no first byte yet
    assert s.offer("g", "a", 300.0, 0.0, deadline=2.0, protect_ms=10_000.0)
    return s


@pytest.mark.parametrize(
    ("protect", "slack", "prefill_ms", "bound_ms", "goes"),
    [
        (False, False, 3000.0, 10_000.0, True),  # off: the order as before
        (True, False, 3000.0, 10_000.0, False),  # late, instance guarded: waits
        (True, False, 3000.0, 0.0, True),  # a class without a bound is never held for others
        (True, True, 1000.0, 10_000.0, True),  # fits the guard's slack (1.7 s)
        (True, True, 1800.0, 10_000.0, False),  # does not
    ],
    ids=["off", "late-waits", "no-bound-goes", "fits-slack", "exceeds-slack"],
)
def test_late_request_while_guarded(
    protect: bool, slack: bool, prefill_ms: float, bound_ms: float, goes: bool
) -> None:
    s = shaper(protect, slack)
    # at 0.4 s the guard's prefill is predicted done: no backlog holds anything
    went = s.offer("late", "a", prefill_ms, 0.4, deadline=0.4, protect_ms=bound_ms)
    assert went is goes
    assert s.held("a") == (0 if goes else 1)


def test_first_byte_of_the_guard_lets_it_go() -> None:
    s = shaper()
    assert not s.offer("late", "a", 3000.0, 0.4, deadline=0.4, protect_ms=10_000.0)
    assert s.release("a", 0.5) == []  # still guarded
    assert s.first_byte("g", "a", 0.9) == ["late"]


def test_bound_runs_out_while_still_guarded() -> None:
    s = shaper()
    assert not s.offer("late", "a", 3000.0, 0.4, deadline=0.4, protect_ms=500.0)
    at = s.next_release_at("a")
    assert at == pytest.approx(0.9)  # the bound, before the guard's deadline (2.0)
    assert s.release("a", 0.9) == ["late"]


def test_guard_deadline_passing_ends_the_guard() -> None:
    s = shaper()
    assert not s.offer("late", "a", 3000.0, 0.4, deadline=0.4, protect_ms=10_000.0)
    assert s.next_release_at("a") == pytest.approx(2.0)
    assert s.release("a", 2.0 + 1e-6) == ["late"]


def test_timely_requests_are_not_held_by_a_guard_they_fit() -> None:
    s = shaper(slack=True)
    # timely (deadline 2.4 s, 100 ms prefill) and within the guard's 1.7 s slack
    assert s.offer("t", "a", 100.0, 0.4, deadline=2.4, protect_ms=10_000.0)


def test_cancel_a_held_request() -> None:
    s = shaper()
    assert not s.offer("late", "a", 3000.0, 0.4, deadline=0.4, protect_ms=10_000.0)
    assert s.cancel("late")
    assert s.held("a") == 0
    assert s.first_byte("g", "a", 0.9) == []


def test_a_request_that_fits_is_not_timed_by_the_protection_of_others() -> None:
    s = shaper(slack=True)
    assert not s.offer("late", "a", 3000.0, 0.1, deadline=0.1, protect_ms=10_000.0)
    # timely, fits the guard's slack, but the backlog (200 ms left) holds it
    assert not s.offer("t", "a", 200.0, 0.1, deadline=2.1, protect_ms=10_000.0)
    at = s.next_release_at("a")
    assert at == pytest.approx(0.15)  # when the backlog falls under the threshold
    assert s.release("a", 0.15 + 1e-6) == ["t"]


def auto_shaper() -> DispatchShaper:
    """Protection only under overload: on while at least 0.7 of the recent offers (moving,
    weight 0.5 each) were predicted to miss their deadline."""
    s = DispatchShaper(
        ShaperConfig(
            hold_above_ms=150.0, order="slo", protect=True, protect_when_missed=0.7,
            protect_miss_alpha=0.5,
        )
    )  # fmt: skip
    assert s.offer("g", "a", 300.0, 0.0, deadline=2.0, protect_ms=10_000.0)  # on time
    return s


@pytest.mark.parametrize(
    ("before", "goes", "share"),
    [
        ((), True, 0.5),  # one late offer of two: not overloaded, it goes as without
        (("late",), False, 0.75),  # most offers late: the guard holds it
        (("late", "on-time", "on-time"), True, 0.5625),  # overload passed
    ],
    ids=["calm", "overloaded", "recovered"],
)  # fmt: skip
def test_auto_protects_only_while_most_offers_are_predicted_late(
    before: tuple[str, ...], goes: bool, share: float
) -> None:
    s = auto_shaper()
    for i, kind in enumerate(before):  # offers to another instance, each sent at once
        prefill_ms, deadline = (3000.0, 0.5) if kind == "late" else (100.0, 2.1)
        assert s.offer(f"o{i}", f"b{i}", prefill_ms, 0.1, deadline=deadline, protect_ms=1e4)
    went = s.offer("late", "a", 3000.0, 0.4, deadline=0.4, protect_ms=10_000.0)
    assert went is goes
    assert s.missed_share() == pytest.approx(share)
    assert s.overloaded is not goes


def test_ended_guards_do_not_pile_up_below_the_auto_threshold() -> None:
    """Under ``auto`` below its threshold nothing consults the guards, yet every timely
    dispatch adds one: the ones whose first byte came must still leave the instance's heap
    (else each dispatch walks every guard there ever was)."""
    s = DispatchShaper(ShaperConfig(50.0, "slo", protect=True, protect_when_missed=0.7))
    now = 0.0
    for i in range(500):
        now += 0.01
        assert s.offer(f"r{i}", "e0", 1.0, now, deadline=now + 2.0, protect_ms=1000.0)
        s.first_byte(f"r{i}", "e0", now + 0.001)
    assert not s.overloaded
    assert len(s._guards._inst["e0"].guards) <= 1
