"""The dispatch order ahead of a FCFS engine (services.common.admission.shaper)."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.admission.shaper import DispatchShaper
from services.common.admission.shaper_config import ShaperConfig
from services.scheduler.admission.dispatch import DispatchOrder


def _shaper(hold_ms: float = 500.0, age: float = 1.0) -> DispatchShaper:
    return DispatchShaper(ShaperConfig(hold_above_ms=hold_ms, age_weight=age, order="shortest"))


def test_off_dispatches_everything_at_once() -> None:
    s = DispatchShaper()
    assert not s.enabled
    assert all(s.offer(f"r{i}", "a", 10_000.0, 0.0) for i in range(5))
    assert s.held() == 0


@pytest.mark.parametrize(
    ("backlog_ms", "expect_now"),
    [(0.0, True), (499.0, True), (500.0, False), (5_000.0, False)],
    ids=["idle", "below", "at-threshold", "far-above"],
)
def test_holds_only_above_the_backlog_threshold(backlog_ms: float, expect_now: bool) -> None:
    s = _shaper(500.0)
    if backlog_ms:
        assert s.offer("first", "a", backlog_ms, 0.0)
    assert s.offer("next", "a", 100.0, 0.0) is expect_now
    assert s.held("a") == (0 if expect_now else 1)


def test_backlog_is_per_instance_and_counts_down_with_time() -> None:
    s = _shaper(500.0)
    assert s.offer("long", "a", 2_000.0, 0.0)
    assert not s.offer("x", "a", 100.0, 0.0)
    assert s.offer("y", "b", 100.0, 0.0)  # another instance is not held by a's backlog
    assert s.backlog_ms("a", 1.0) == pytest.approx(1_000.0)
    assert s.release("a", 1.0) == []  # 1,000 ms still ahead
    assert s.next_release_at("a") == pytest.approx(1.5)
    assert s.release("a", 1.6) == ["x"]


@pytest.mark.parametrize(
    ("own_ms", "foreign_ms", "at_s", "release_at"),
    [
        # hold 500 ms: own 2,000 and foreign 1,000 run down together until the foreign ends
        # at 1 s (own 1,000 left), then own alone to 500: 1.5 s
        (2_000.0, 1_000.0, 0.0, 1.5),
        # both 1,000: the sum reaches 500 while both run, at 0.75 s
        (1_000.0, 1_000.0, 0.0, 0.75),
        # only a foreign backlog: it alone must fall to 500
        (0.0, 2_000.0, 0.0, 1.5),
    ],
    ids=["foreign-ends-first", "both-run", "foreign-only"],
)
def test_other_replicas_backlog_adds_to_the_own(
    own_ms: float, foreign_ms: float, at_s: float, release_at: float
) -> None:
    s = _shaper(500.0)
    if own_ms:
        assert s.offer("own", "a", own_ms, at_s)
    assert s.set_foreign({"a": foreign_ms}, at_s) == {"a": []}
    assert s.backlog_ms("a", at_s) == pytest.approx(own_ms + foreign_ms)
    assert not s.offer("next", "a", 100.0, at_s)
    assert s.next_release_at("a") == pytest.approx(release_at)
    assert s.release("a", release_at - 0.01) == []
    assert s.release("a", release_at + 0.01) == ["next"]


def test_a_lower_foreign_backlog_lets_waiting_requests_go_and_none_is_forgotten() -> None:
    s = _shaper(500.0)
    s.set_foreign({"a": 3_000.0}, 0.0)
    assert not s.offer("x", "a", 100.0, 0.0)
    assert s.set_foreign({"a": 2_000.0}, 0.1) == {"a": []}  # still above: nothing goes
    assert s.set_foreign({}, 0.2) == {"a": ["x"]}  # the other replica's backlog is gone
    assert s.backlog_ms("a", 0.2) == pytest.approx(100.0)  # x's own prefill, now dispatched
    assert s.set_foreign({}, 0.3) == {}


def test_own_backlog_is_reported_only_while_the_order_is_on() -> None:
    on, off = _shaper(500.0), DispatchShaper()
    for s in (on, off):
        s.offer("r", "a", 800.0, 0.0)
    assert on.own_backlog(0.3) == {"a": pytest.approx(500.0)}
    assert off.own_backlog(0.3) == {}
    on.set_foreign({"a": 1_000.0}, 0.3)
    assert on.own_backlog(0.3) == {"a": pytest.approx(500.0)}  # never the foreign part


@pytest.mark.parametrize(
    ("waiting", "order"),
    [
        # (rid, predicted prefill ms, offered at s, class rank)
        ([("big", 6_000.0, 0.0, 0), ("small", 100.0, 0.0, 0)], ["small", "big"]),
        ([("a", 300.0, 0.0, 0), ("b", 200.0, 0.0, 0), ("c", 100.0, 0.0, 0)], ["c", "b", "a"]),
        # a higher class (lower rank) goes first whatever its prefill
        ([("batch", 80.0, 0.0, 1), ("interactive", 900.0, 0.0, 0)], ["interactive", "batch"]),
        # ageing: 5 s of waiting is worth 5,000 ms of predicted prefill
        ([("old", 5_500.0, 0.0, 0), ("young", 1_000.0, 5.0, 0)], ["old", "young"]),
    ],
    ids=["shortest-first", "three-by-length", "class-before-length", "ageing"],
)
def test_release_order(waiting: list[tuple[str, float, float, int]], order: list[str]) -> None:
    s = _shaper(500.0)
    assert s.offer("running", "a", 10_000.0, 0.0)
    for rid, ms, at, rank in waiting:
        assert not s.offer(rid, "a", ms, at, rank=rank)
    got: list[str] = []
    now = 10.0
    for _ in waiting:  # each release lets one go: the next one's prefill refills the backlog
        got += s.release("a", now)
        now += 100.0
    assert got == order


def test_an_early_first_byte_cuts_the_prediction() -> None:
    s = _shaper(500.0)
    assert s.offer("long", "a", 8_000.0, 0.0)
    assert not s.offer("short", "a", 100.0, 0.0)
    # The engine was faster than the model: the first byte at 2 s frees the instance.
    assert s.first_byte("long", "a", 2.0) == ["short"]
    # ... and 2 s observed for 8 s predicted moves its speed a fifth of the way to 0.25.
    assert s.speed("a") == pytest.approx(0.85)
    assert s.backlog_ms("a", 2.0) == pytest.approx(85.0)


@pytest.mark.parametrize(
    ("answer_after_s", "speed_below"),
    [(0.0002, 0.05), (0.5, 1.0001)],
    ids=["canned-upstream-speeds-up", "slow-engine-capped-at-1"],
)
def test_speed_follows_first_bytes(answer_after_s: float, speed_below: float) -> None:
    """An upstream that answers in 0.2 ms where the model predicts 40 ms ends up with a small
    speed and no holds; one slower than the model never goes above 1."""
    s = _shaper(150.0)
    now = 0.0
    for i in range(40):
        assert s.offer(f"r{i}", "a", 40.0, now)
        now += answer_after_s
        s.first_byte(f"r{i}", "a", now)
    assert s.speed("a") < speed_below
    if speed_below < 1:
        # 64 requests in flight at once no longer reach the 150 ms threshold
        assert all(s.offer(f"x{i}", "a", 40.0, now) for i in range(64))


def test_small_prompts_go_at_once() -> None:
    """Under an eighth of the threshold of predicted prefill: never held."""
    s = _shaper(500.0)
    assert s.offer("long", "a", 3_000.0, 0.0)
    assert not s.offer("w", "a", 200.0, 0.0)
    assert s.offer("tiny", "a", 60.0, 0.0)  # 60 < 500 / 8
    assert s.held("a") == 1


def test_first_byte_with_others_outstanding_keeps_their_share() -> None:
    s = _shaper(500.0)
    assert s.offer("p", "a", 400.0, 0.0)
    assert s.offer("r", "a", 900.0, 0.0)  # backlog 400 < 500: goes too
    assert not s.offer("q", "a", 100.0, 0.0)  # backlog 1,300
    # p's first byte at 0.2 s: r's 900 ms are still ahead, so q keeps waiting ...
    assert s.first_byte("p", "a", 0.2) == []
    assert s.backlog_ms("a", 0.2) == pytest.approx(900.0)
    # ... until the prediction of r runs down below the threshold.
    assert s.release("a", 0.7) == ["q"]


def test_new_requests_queue_behind_waiting_ones() -> None:
    """Once anyone waits for an instance, a newcomer waits too, and goes in key order (here
    the older request has aged past the newcomer's shorter prefill)."""
    s = _shaper(500.0)
    assert s.offer("long", "a", 3_000.0, 0.0)
    assert not s.offer("w", "a", 200.0, 0.0)
    assert s.backlog_ms("a", 2.9) < 500.0
    assert not s.offer("newcomer", "a", 100.0, 2.9)
    assert s.release("a", 2.9) == ["w", "newcomer"]


def test_cancel_and_done_are_idempotent() -> None:
    s = _shaper(500.0)
    assert s.offer("long", "a", 3_000.0, 0.0)
    assert not s.offer("w", "a", 200.0, 0.0)
    assert s.cancel("w")
    assert not s.cancel("w")
    assert s.held() == 0
    assert s.done("long", "a", 1.0) == []
    assert s.done("long", "a", 1.0) == []
    assert s.backlog_ms("a", 1.0) == 0.0


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_order_shell_waits_releases_on_first_byte_and_withdraws_cancelled() -> None:
    clock = _Clock()
    order = DispatchOrder(_shaper(500.0), clock)
    assert order.offer("long", "a", 8_000.0) is None  # idle instance: at once
    small_turn, gone_turn = order.offer("small", "a", 100.0), order.offer("gone", "a", 80.0)
    assert small_turn is not None and gone_turn is not None
    small = asyncio.create_task(order.wait("small", small_turn))
    gone = asyncio.create_task(order.wait("gone", gone_turn))
    await asyncio.sleep(0)
    assert not small.done() and order.shaper.held("a") == 2
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert order.shaper.held("a") == 1
    clock.t = 1.0
    order.first_byte("long")  # the engine was faster than predicted
    await asyncio.wait_for(small, 1.0)
    order.done("small")
    order.done("long")
    order.done("long")  # idempotent
    assert order.shaper.backlog_ms("a", 1.0) == 0.0
    order.close()


async def test_order_shell_timer_lets_waiters_go_when_the_prediction_runs_out() -> None:
    order = DispatchOrder(_shaper(50.0), time.monotonic)
    assert order.offer("p", "a", 80.0) is None  # 80 ms predicted, no first byte will come
    turn = order.offer("q", "a", 10.0)
    assert turn is not None
    await asyncio.wait_for(order.wait("q", turn), 5.0)  # the instance's timer released it
    order.close()


@pytest.mark.parametrize(
    ("waiting", "at", "order"),
    [
        # (rid, predicted prefill ms, deadline s or None); released at ``at`` s
        # feasible ones by latest start (deadline - prefill), before anything late
        (
            [("late-start", 100.0, 3.0), ("early-start", 900.0, 2.0)],
            0.5,
            ["early-start", "late-start"],
        ),
        # a prompt that can never meet its deadline waits behind one that can, though shorter
        ([("hopeless", 80.0, 0.01), ("timely", 800.0, 2.0)], 0.5, ["timely", "hopeless"]),
        # no deadline (a class without a TTFT target): behind the timely ones
        ([("batch", 80.0, None), ("agent", 500.0, 5.0)], 0.5, ["agent", "batch"]),
        # deadlines passed while waiting: the rest goes shortest first
        ([("a", 700.0, 1.0), ("b", 200.0, 1.0)], 3.0, ["b", "a"]),
    ],
    ids=["by-latest-start", "infeasible-last", "no-deadline-last", "expired-shortest"],
)
def test_slo_order(
    waiting: list[tuple[str, float, float | None]], at: float, order: list[str]
) -> None:
    s = DispatchShaper(ShaperConfig(hold_above_ms=500.0, order="slo"))
    assert s.offer("running", "a", 10_000.0, 0.0)
    for rid, ms, due in waiting:
        assert not s.offer(rid, "a", ms, 0.0, deadline=due)
    got: list[str] = []
    now = at
    for _ in waiting:
        got += s.first_byte("running", "a", now)  # the running prompt's first byte
        got += s.release("a", now)
        now += 100.0
    assert got == order
