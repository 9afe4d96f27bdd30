"""The dispatch order's asyncio shell: requests wait here for their turn on their instance.

Over the pure :class:`~services.common.admission.shaper.DispatchShaper` (the rule is in
its docstring). Between a pick and its forward the HTTP gateway calls
:meth:`DispatchOrder.offer`, and awaits :meth:`DispatchOrder.wait` when that gives no turn
at once; it reports the first byte (:meth:`first_byte`) and the end of every pick, however
it ended (:meth:`done`). A timer per instance lets waiting requests go when the predicted
backlog runs down with no event (or a follower's wait for its carrier runs out). Cancelling a waiting :meth:`wait` (the client went away)
withdraws the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from tideserve.v1 import events_pb2

from services.common.admission.shaper import DispatchShaper
from services.common.scheduling.shared_state import apply_carrier

__all__ = ["DispatchOrder"]


class DispatchOrder:
    def __init__(self, shaper: DispatchShaper, clock: Callable[[], float]) -> None:
        self.shaper = shaper
        self.clock = clock
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._target: dict[str, str] = {}  # rid -> instance, from its turn until done
        self._timers: dict[str, asyncio.TimerHandle] = {}

    @property
    def enabled(self) -> bool:
        return self.shaper.enabled

    def offer(
        self,
        rid: str,
        instance_id: str,
        prefill_ms: float,
        rank: int = 0,
        deadline: float | None = None,
        prefix: tuple[int, ...] = (),
        cached_blocks: int = 0,
        protect_ms: float = 0.0,
    ) -> asyncio.Future[None] | None:
        """None: send ``rid`` to ``instance_id`` now. Otherwise a future to :meth:`wait`
        on. Always follow with :meth:`done`. (Synchronous, so that the common case costs
        no coroutine.)"""
        self._target[rid] = instance_id
        now = self.clock()
        if self.shaper.offer(
            rid, instance_id, prefill_ms, now, rank, deadline, prefix, cached_blocks, protect_ms
        ):
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        self._arm(instance_id)
        return fut

    async def wait(self, rid: str, fut: asyncio.Future[None]) -> None:
        """Wait for the turn :meth:`offer` did not give at once; cancelling withdraws it."""
        try:
            await fut
        except asyncio.CancelledError:
            self._waiters.pop(rid, None)
            if self.shaper.cancel(rid):
                iid = self._target.pop(rid, None)
                if iid is not None:  # its followers, if any, go now
                    self._arm(iid)
            raise

    def first_byte(self, rid: str) -> None:
        """``rid``'s instance answered: its prefill is over."""
        iid = self._target.get(rid)
        if iid is not None:
            self._go(iid, self.shaper.first_byte(rid, iid, self.clock()))

    def done(self, rid: str) -> None:
        """``rid`` ended (answered, failed or cancelled). Idempotent."""
        iid = self._target.pop(rid, None)
        if iid is not None:
            self._go(iid, self.shaper.done(rid, iid, self.clock()))

    def own_backlog(self) -> dict[str, float]:
        """This gateway's backlog per instance (ms), for the other replicas' heartbeats."""
        return self.shaper.own_backlog(self.clock())

    def set_foreign(self, backlogs: Mapping[str, float]) -> None:
        """The other replicas' backlog per instance now (ms): requests it lets go are sent,
        and the instances' timers re-timed."""
        for iid, rids in self.shaper.set_foreign(dict(backlogs), self.clock()).items():
            self._go(iid, rids)

    def foreign(self, entry: events_pb2.RoutedPrefix, replica_id: str, wall_ms: int) -> None:
        """Another replica's pick or its end (the shared routed stream): a carrier for the
        requests here, or its followers set free (sent)."""
        go = apply_carrier(
            self.shaper, entry, replica_id=replica_id, now=self.clock(), wall_ms=wall_ms
        )
        for iid, rids in go.items():
            self._go(iid, rids)

    def close(self) -> None:
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()

    def _go(self, instance_id: str, rids: Iterable[str]) -> None:
        for rid in rids:
            fut = self._waiters.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        if self._timers or self._waiters:  # nothing to time when nobody waits
            self._arm(instance_id)

    def _arm(self, instance_id: str) -> None:
        at = self.shaper.next_release_at(instance_id)
        old = self._timers.pop(instance_id, None)
        if old is not None:
            old.cancel()
        if at is None:
            return
        delay = max(0.0, at - self.clock()) + 1e-3
        loop = asyncio.get_running_loop()
        self._timers[instance_id] = loop.call_later(delay, self._on_timer, instance_id)

    def _on_timer(self, instance_id: str) -> None:
        self._timers.pop(instance_id, None)
        self._go(instance_id, self.shaper.release(instance_id, self.clock()))
