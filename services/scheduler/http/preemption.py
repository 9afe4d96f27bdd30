"""Pre-emption before the first byte (gateway shell over :func:`plan_preemptions`).

Every dispatch to an engine runs in its own task, registered under its pick id with its
class priority. When a higher class waits in the admission queue and no capacity is left,
:meth:`Preemptor.consider` picks victims among dispatches that have not received their first
byte from the engine and cancels their tasks: the upstream connection is closed (the engine
aborts the request) and the dispatch raises :class:`Preempted`, on which the gateway
requeues the request with its original arrival time. A dispatch marked :meth:`started` (its
first byte arrived) is never pre-empted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from services.common.admission import InFlight, plan_preemptions
from services.common.scheduling.service import GatewayCore

__all__ = ["Preempted", "Preemptor"]

T = TypeVar("T")


class Preempted(Exception):
    """The dispatch was pre-empted before its first byte; requeue the request."""


@dataclass(slots=True)
class _Dispatch:
    priority: int
    released_at: float
    task: asyncio.Task[Any]
    started: bool = False
    preempted: bool = False


class Preemptor:
    """Tracks dispatches that may be pre-empted. Not thread-safe (one event loop)."""

    def __init__(
        self, core: GatewayCore, clock: Callable[[], float], *, enabled: bool = True
    ) -> None:
        self.core = core
        self.clock = clock
        self.enabled = enabled
        self.total = 0  # pre-emptions so far
        self._live: dict[str, _Dispatch] = {}
        # Live dispatches without their first byte, by class priority: lets consider()
        # answer "nothing to pre-empt" without a pass over every dispatch.
        self._unstarted: Counter[int] = Counter()
        self._in_progress = 0  # cancelled, not yet unwound
        self._top = max(c.priority for c in core.queue.config.classes)

    def __len__(self) -> int:
        return len(self._live)

    async def run(self, pick_id: str, slo_class: str, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` as the dispatch ``pick_id``. Raises :class:`Preempted` if it was
        pre-empted; other outcomes (results, exceptions, the caller's own cancellation)
        pass through."""
        prio = self.core.queue.class_of(slo_class).priority
        if not self.enabled or prio >= self._top:
            return await coro  # the top class is never pre-empted: no task needed
        task = asyncio.create_task(coro)
        d = _Dispatch(prio, self.clock(), task)
        self._live[pick_id] = d
        self._unstarted[prio] += 1
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if d.preempted and (me is None or me.cancelling() == 0):
                raise Preempted(pick_id) from None
            raise
        finally:
            del self._live[pick_id]
            if not d.started:
                self._unstarted[prio] -= 1
            if d.preempted:
                self._in_progress -= 1

    def started(self, pick_id: str) -> None:
        """The first byte of ``pick_id`` arrived: never pre-empt it. Unknown ids: no-op."""
        d = self._live.get(pick_id)
        if d is not None and not d.started:
            d.started = True
            self._unstarted[d.priority] -= 1

    def consider(self, now: float, capacity: int) -> list[str]:
        """Pre-empt what :func:`plan_preemptions` says for the current queue and capacity
        (call when ``capacity`` <= 0 and the queue is not empty). Returns the pick ids."""
        if not self.enabled or not self._live:
            return []
        waiting = self.core.queue.waiting_priorities()
        if not waiting or not any(n for p, n in self._unstarted.items() if p < max(waiting)):
            return []  # no dispatch of a class below the best waiting one can be taken back
        cands = [
            InFlight(pid, d.priority, d.started, d.released_at)
            for pid, d in self._live.items()
            if not d.preempted and not d.task.done()
        ]
        victims = plan_preemptions(
            self.core.queue,
            cands,
            capacity=capacity,
            saturated=self.core.saturated(now),
            in_progress=self._in_progress,
        )
        for pid in victims:
            d = self._live[pid]
            if d.task.cancel():
                d.preempted = True
                self._in_progress += 1
                self.total += 1
        return victims
