"""The manual clock moves only when told (tests and simulations drive shells with it)."""

from __future__ import annotations

import pytest

from services.common.clock import ManualClock


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
