"""The admission gate (asyncio shell over the pure queue): the one waiting room of a core.

The HTTP gateway and the gRPC servicer of one process share one gate, as they share one
core and its :class:`~services.common.admission.queue.AdmissionQueue`. :meth:`take_in` is
the asynchronous step of the intake (:mod:`services.scheduler.core.intake`): the best-effort
precise-prefix lookup, then admission: at once when nothing is queued and a slot is free,
else a place in the classed queue until :meth:`pump` releases it (capacity freed) or the
queue expires it (class ``max_queue_ms`` or the request's deadline). A shed or expired
request raises :class:`~services.scheduler.core.intake.Refused` (``overloaded``, with a
retry hint). A request no engine can serve
(:meth:`~services.common.scheduling.service.GatewayCore.unavailable`: none registered, or
all unhealthy, draining or open-circuit) does not wait: it is refused ``unavailable`` at
once, and so is every waiting request when the last engine that could serve them goes.
While anyone waits, the gate pumps itself every ``tick_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from services.common.admission.queue import Shed
from services.common.routing.types import PrefixMatch, RequestView
from services.common.scheduling.service import GatewayCore
from services.scheduler.core.intake import Intake, Refused, admit_at_once, queued

__all__ = ["AdmissionGate", "PrefixLookup"]

PrefixLookup = Callable[[RequestView, str, str, str], Awaitable[Mapping[str, PrefixMatch] | None]]
"""(view, deployment, tenant, profile) → per-instance matches, or None (best effort;
e.g. :class:`services.scheduler.feeds.kvmeta_client.KVMetaLookup`)."""


class AdmissionGate:
    def __init__(
        self,
        core: GatewayCore,
        clock: Callable[[], float],
        *,
        deployment: str = "",
        prefix_lookup: PrefixLookup | None = None,
        tick_s: float = 0.05,
    ) -> None:
        self.core = core
        self.clock = clock
        self.deployment = deployment
        self.prefix_lookup = prefix_lookup
        self.tick_s = tick_s
        # Called with (now, capacity) when requests wait and no capacity is left; returns
        # how many dispatches it pre-empted (the HTTP gateway's pre-emption).
        self.on_full: Callable[[float, int], object] | None = None
        # Per waiting request: its release (None) or its refusal.
        self._waiters: dict[str, asyncio.Future[Refused | None]] = {}
        self._released = 0  # released from the queue, not yet picked
        self._ticker: asyncio.Task[None] | None = None

    async def take_in(self, intake: Intake, view: RequestView, arrival: float) -> RequestView:
        """Look the prefix up, then admit (see the module doc); the view to route with."""
        view = await self.lookup(view, intake)
        await self.admit(intake, arrival)
        return view

    async def lookup(self, view: RequestView, intake: Intake) -> RequestView:
        """``view`` with the precise-prefix matches, when a lookup is wired and answers."""
        if self.prefix_lookup is None or not view.block_hashes:
            return view
        with contextlib.suppress(Exception):  # best effort: route without precise data
            found = await self.prefix_lookup(
                view, self.deployment, intake.index_tenant, intake.profile
            )
            if found is not None:
                view = replace(view, prefix_matches=found)
        return view

    async def admit(self, intake: Intake, arrival: float) -> None:
        now = self.clock()
        if admit_at_once(self.core, now, self._released):
            return
        why = self.core.unavailable(now, intake.exclude)
        if why is not None:
            raise Refused("unavailable", why)
        res = self.core.queue.offer(queued(intake, arrival), now)
        if isinstance(res, Shed):
            raise Refused(
                "overloaded", f"overloaded: {res.reason}", retry_after_ms=res.retry_after_ms
            )
        await self.wait(intake)

    async def requeue(self, intake: Intake, arrival: float) -> None:
        """Back in line with its original arrival (pre-empted), then wait again."""
        self.core.queue.requeue(queued(intake, arrival), arrival)
        await self.wait(intake)

    async def wait(self, intake: Intake) -> None:
        """Wait until the queued request is released; Refused when it timed out or no
        engine is left to serve it."""
        rid, q = intake.request_id, self.core.queue
        fut: asyncio.Future[Refused | None] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick_while_waiting())
        self.pump()
        try:
            refused = await fut
        except asyncio.CancelledError:
            self._waiters.pop(rid, None)
            q.cancel(rid)
            raise
        if refused is not None:
            raise refused
        self._released -= 1

    def _timed_out(self, slo_class: str) -> Refused:
        q = self.core.queue
        return Refused(
            "overloaded",
            "timed out in the admission queue",
            retry_after_ms=q.retry_after_ms(slo_class or q.config.default_class),
            where="queue_timeout",
        )

    def pump(self) -> None:
        """Expire overdue waiters, refuse them all when no engine can serve them, then
        release as many as there is capacity for."""
        now = self.clock()
        q = self.core.queue
        for r in q.expire(now):
            fut = self._waiters.pop(r.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(self._timed_out(r.slo_class))
        if not len(q):
            return
        cap = self.core.capacity(now) - self._released
        if cap <= 0:
            why = self.core.unavailable(now) if self._waiters else None
            if why is not None:
                self._refuse_all(Refused("unavailable", why))
            elif self.on_full is not None:
                self.on_full(now, cap)
            return
        for r in q.next(now, cap):
            fut = self._waiters.pop(r.request_id, None)
            if fut is not None and not fut.done():
                self._released += 1
                fut.set_result(None)

    async def _tick_while_waiting(self) -> None:
        while self._waiters:
            await asyncio.sleep(self.tick_s)
            self.pump()

    def _refuse_all(self, refused: Refused) -> None:
        """Take every waiting request out of the queue and refuse it with ``refused``."""
        waiters, self._waiters = self._waiters, {}
        for rid, fut in waiters.items():
            self.core.queue.cancel(rid)
            if not fut.done():
                fut.set_result(refused)

    async def close(self) -> None:
        """Refuse every waiter (shutting down) and stop the ticker."""
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_result(self._timed_out(""))
        self._waiters.clear()
        task, self._ticker = self._ticker, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
