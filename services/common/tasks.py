"""Background asyncio tasks: stoppable pauses and bounded shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["pause", "stop_tasks"]

log = logging.getLogger(__name__)


async def pause(stopping: asyncio.Event, seconds: float | None) -> bool:
    """Wait up to ``seconds`` (None: without limit), returning early once ``stopping`` is
    set; returns whether it is set.

    Built on ``asyncio.wait``, not ``asyncio.wait_for(stopping.wait(), seconds)``: on 3.11
    ``wait_for`` can swallow a cancellation that races with the event being set, and the
    loop that called it then runs on and hangs whoever waits for it to stop. Here a
    cancellation always propagates and the inner waiter never outlives the call.
    """
    if stopping.is_set():
        return True
    waiter = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()
    return stopping.is_set()


async def stop_tasks(
    tasks: Sequence[asyncio.Task[Any]], *, grace_s: float = 3.0, cancel_wait_s: float = 2.0
) -> None:
    """Let cooperative loops (which watch a stop event) finish within ``grace_s``, then cancel
    what is left and wait at most ``cancel_wait_s`` more. Never waits forever: a task that
    swallowed its cancellation is logged and abandoned rather than hanging shutdown."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=grace_s)
    for t in pending:
        t.cancel()
    if pending:
        _, stuck = await asyncio.wait(pending, timeout=cancel_wait_s)
        for t in stuck:
            log.warning("task %s did not stop; abandoned", t.get_name())
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            log.warning("task %s ended with %r", t.get_name(), t.exception())
