"""Write-through persistence of a pure core's changes (the object master, the sessions)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["WriteThrough"]

C = TypeVar("C")


class WriteThrough(Generic[C]):
    """Each call drains the core's changes and saves them, one writer at a time and in
    order. A save that fails puts its changes back, so the next call (an RPC's or a tick's)
    saves them again before anything newer. Without ``save`` (no store) the changes are
    only drained."""

    def __init__(
        self,
        drain: Callable[[], C],
        requeue: Callable[[C], None],
        save: Callable[[C], Awaitable[None]] | None,
    ) -> None:
        self._drain, self._requeue, self._save = drain, requeue, save
        self._lock = asyncio.Lock()

    async def __call__(self) -> None:
        if self._save is None:
            self._drain()
            return
        async with self._lock:
            changes = self._drain()
            try:
                await self._save(changes)
            except BaseException:
                self._requeue(changes)
                raise
