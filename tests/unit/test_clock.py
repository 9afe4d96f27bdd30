"""Clocks: the system clock reads real time; the manual clock moves only when told."""

from __future__ import annotations

import time

import pytest

from services.common.clock import Clock, ManualClock, SystemClock


@pytest.mark.parametrize("clock", [SystemClock(), ManualClock(5.0)], ids=["system", "manual"])
def test_clocks_satisfy_protocol(clock: Clock) -> None:
    assert isinstance(clock, Clock)
    first = clock.monotonic()
    assert clock.monotonic() >= first


def test_system_clock_is_wall_time() -> None:
    before = time.time()
    now = SystemClock().now()
    assert before <= now <= time.time()


@pytest.mark.parametrize(
    ("start", "steps", "now", "monotonic"),
    [
        (0.0, [], 0.0, 0.0),
        (1000.0, [1.5], 1001.5, 1.5),
        (1000.0, [0.25, 0.25, 0.0, 2.0], 1002.5, 2.5),
    ],
    ids=["start", "one-step", "several-steps"],
)
def test_manual_clock_advance(
    start: float, steps: list[float], now: float, monotonic: float
) -> None:
    clock = ManualClock(start)
    for dt in steps:
        clock.advance(dt)
    assert clock.now() == pytest.approx(now)
    assert clock.monotonic() == pytest.approx(monotonic)


def test_manual_clock_set_jumps_forward() -> None:
    clock = ManualClock(100.0)
    clock.set(160.0)
    assert (clock.now(), clock.monotonic()) == (160.0, 60.0)


@pytest.mark.parametrize(
    "move",
    [lambda c: c.advance(-0.001), lambda c: c.set(99.0)],
    ids=["negative-advance", "set-into-past"],
)
def test_manual_clock_never_goes_back(move: object) -> None:
    clock = ManualClock(100.0)
    with pytest.raises(ValueError, match="backwards"):
        move(clock)  # type: ignore[operator]
    assert clock.now() == 100.0
