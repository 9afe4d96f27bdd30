"""Waiting, in async tests, for a condition that another process or task brings about."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(pred: Callable[[], Awaitable[bool]], within_s: float = 15.0) -> None:
    """Await ``pred()`` every 50 ms until it is true; AssertionError after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def bounded(aw: Awaitable[object], what: str, timeout_s: float = 20.0) -> None:
    """Teardown steps fail fast, naming the step, instead of hanging the suite."""
    try:
        await asyncio.wait_for(aw, timeout_s)
    except TimeoutError:
        raise AssertionError(f"teardown hung: {what}") from None
