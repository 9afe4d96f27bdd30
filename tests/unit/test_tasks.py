"""services.common.tasks: the stoppable pause (no timing assertions: outcomes only)."""

from __future__ import annotations

import asyncio

import pytest

from services.common.tasks import pause


async def test_pause_returns_false_when_the_time_runs_out() -> None:
    assert await pause(asyncio.Event(), 0.0) is False


async def test_pause_returns_true_at_once_when_already_set() -> None:
    stop = asyncio.Event()
    stop.set()
    assert await pause(stop, None) is True


async def test_pause_wakes_when_the_event_is_set() -> None:
    stop = asyncio.Event()
    waiting = asyncio.create_task(pause(stop, None))  # no limit: only the event ends it
    await asyncio.sleep(0)
    assert not waiting.done()
    stop.set()
    assert await asyncio.wait_for(waiting, 30) is True


async def test_pause_propagates_cancellation_and_leaves_no_waiter() -> None:
    stop = asyncio.Event()
    before = len(asyncio.all_tasks())
    waiting = asyncio.create_task(pause(stop, None))
    await asyncio.sleep(0)
    waiting.cancel()
    stop.set()  # racing with the cancellation: it must still win
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for _ in range(10):  # the inner waiter finishes its cancellation within a few turns
        if len(asyncio.all_tasks()) == before:
            break
        await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before
