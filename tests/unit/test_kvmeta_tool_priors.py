"""kvmeta's tool-time priors shell: telemetry's answers installed whole, failures keep the
last priors and are logged at most once a minute, the loop stops on request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from services.common.clock import ManualClock
from services.common.sessions import GapQuantiles, ToolTimePredictor
from services.kvmeta.tool_priors import PRIOR_PERCENTILES, Table, ToolTimePriors

GRID = (0.5, 0.9)
BASH = GapQuantiles("", "bash", 50, (10.0, 20.0))


class FakeTelemetry:
    """Answers each call with the next scripted table, or raises it."""

    def __init__(self, answers: Sequence[Table | Exception]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, tuple[float, ...], int]] = []
        self.called = asyncio.Event()

    async def tool_times(
        self, deployment: str, percentiles: Sequence[float], min_samples: int
    ) -> Table:
        self.asked.append((deployment, tuple(percentiles), min_samples))
        self.called.set()
        a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(a, Exception):
            raise a
        return a


def shell(
    answers: Sequence[Table | Exception], clock: ManualClock
) -> tuple[ToolTimePriors, ToolTimePredictor, FakeTelemetry]:
    p = ToolTimePredictor(min_samples=5)
    fake = FakeTelemetry(answers)
    return (
        ToolTimePriors(p, fake, deployment="llama", refresh_s=60.0, clock=clock.monotonic),
        p,
        fake,
    )


@pytest.mark.parametrize(
    ("second", "ok", "source"),
    [
        ((GRID, []), True, "default"),  # telemetry knows nothing (restarted): priors cleared
        (RuntimeError("telemetry away"), False, "prior_tool"),
        ((GRID, [GapQuantiles("", "bash", 50, (1.0,))]), False, "prior_tool"),  # malformed
        (((0.9, 0.5), [BASH]), False, "prior_tool"),  # unordered grid
    ],
    ids=["empty-clears", "failure-keeps", "malformed-keeps", "bad-grid-keeps"],
)
async def test_second_answer(second: Table | Exception, ok: bool, source: str) -> None:
    priors, p, fake = shell([(GRID, [BASH]), second], ManualClock())
    assert await priors.refresh()
    assert p.predict(("bash",), "", 0.5).source == "prior_tool"
    assert await priors.refresh() is ok
    assert p.predict(("bash",), "", 0.5).source == source
    assert fake.asked[0] == ("llama", PRIOR_PERCENTILES, 5)  # only confident rows travel
    assert (priors.refreshes, priors.failures) == (1 + ok, int(not ok))


async def test_failures_are_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    priors, _, _ = shell([RuntimeError("away")], clock)
    caplog.set_level(logging.WARNING, logger="services.kvmeta.tool_priors")
    for step in (0.0, 10.0, 49.0, 1.0, 30.0):  # t = 0, 10, 59, 60, 90
        clock.advance(step)
        assert not await priors.refresh()
    assert priors.failures == 5
    assert len(caplog.records) == 2  # at t = 0 and t = 60
    assert "away" in caplog.records[0].getMessage()


async def test_run_refreshes_at_once_and_stops_when_asked() -> None:
    priors, p, fake = shell([(GRID, [BASH])], ManualClock())
    stopping = asyncio.Event()
    task = asyncio.create_task(priors.run(stopping))
    await asyncio.wait_for(fake.called.wait(), 5.0)
    stopping.set()
    await asyncio.wait_for(task, 5.0)
    assert p.priors == 1 and len(fake.asked) == 1
