"""services.engine.pacing.step_start: the engine shell keeps the modelled step schedule
within its catch-up window, and never starts a step before an admitted request arrived."""

from __future__ import annotations

import pytest

from services.engine.pacing import step_start


@pytest.mark.parametrize(
    ("wall", "planned", "newest", "catch_up", "start"),
    [
        (100.0, None, 0.0, 200.0, 100.0),  # after an idle wait or a stall: the wall clock
        (101.5, 100.0, 0.0, 200.0, 100.0),  # 1.5 ms of shell overhead: not added
        (100.0, 100.0, 0.0, 200.0, 100.0),  # on time
        (99.8, 100.0, 0.0, 200.0, 100.0),  # woke early: still the planned end
        (350.0, 100.0, 0.0, 200.0, 350.0),  # 250 ms behind: the schedule restarts
        (300.0, 100.0, 0.0, 200.0, 100.0),  # exactly at the window's edge: kept
        (105.0, 100.0, 103.0, 200.0, 103.0),  # a request arrived at 103: not before it
        (105.0, 100.0, 98.0, 200.0, 100.0),  # an earlier arrival changes nothing
        (101.0, 100.0, 0.0, 0.0, 101.0),  # catch-up off: every step at the wall clock
    ],
    ids=[
        "idle",
        "overhead-absorbed",
        "on-time",
        "woke-early",
        "too-far-behind",
        "window-edge",
        "newest-arrival",
        "older-arrival",
        "catch-up-off",
    ],
)
def test_step_start(
    wall: float, planned: float | None, newest: float, catch_up: float, start: float
) -> None:
    assert step_start(wall, planned, newest, catch_up) == start
