"""Agent-session turns to kvmeta, off the request path (``agent_sessions``).

:class:`SessionFeed` is two gateway hooks and a task. :meth:`SessionFeed.picked` (a turn
listener: called with every pick of a request) queues kvmeta's ``StartSessionTurn`` on the
request's first pick and keeps the prompt's chain tip; :meth:`SessionFeed.finished` (a
``finished`` listener) queues ``EndSessionTurn`` with it (what they carry:
:mod:`services.scheduler.core.session_turns`). The task sends the queue in order, one call
at a time under ``deadline_s``, so kvmeta sees a session's start before its end.

Fire and forget: the hooks never block, never raise and never fail a request. Past
``buffer`` queued calls a new one is dropped; a call kvmeta refuses or that times out is
dropped too (not retried: a late start would teach the tool-time predictor a wrong gap);
an end whose start could not be queued is not queued either. Every outcome is counted in ``stats``
(``queued``, ``sent``, ``dropped``, ``errors``, ``timeouts``), exported by the gateway's
integrations as ``tideserve_gateway_sessions_total{event}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

import grpc
from google.protobuf.message import Message
from tideserve.v1 import kvmeta_pb2

from services.common.routing.types import RequestView
from services.common.tasks import stop_tasks
from services.scheduler.core.records import RequestContext
from services.scheduler.core.session_turns import Tip, tip_of, turn_end, turn_start
from services.scheduler.http.records import Ending

__all__ = ["END_TURN", "START_TURN", "SessionFeed"]

START_TURN = "/tideserve.v1.KVMetaService/StartSessionTurn"
END_TURN = "/tideserve.v1.KVMetaService/EndSessionTurn"
LOG_EVERY_S = 60.0

log = logging.getLogger(__name__)


class SessionFeed:
    """Session turns to kvmeta (module doc). ``start()`` runs the sender, ``stop()`` ends it
    after sending what is queued (best effort, bounded by ``stop_grace_s``)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        deployment: str,
        buffer: int = 10_000,
        deadline_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        stop_grace_s: float = 2.0,
    ) -> None:
        self.deployment = deployment
        self.buffer = buffer
        self.deadline_s = deadline_s
        self.clock = clock
        self.stop_grace_s = stop_grace_s
        self._calls = {
            START_TURN: channel.unary_unary(
                START_TURN,
                request_serializer=kvmeta_pb2.StartSessionTurnRequest.SerializeToString,
                response_deserializer=kvmeta_pb2.SessionResponse.FromString,
            ),
            END_TURN: channel.unary_unary(
                END_TURN,
                request_serializer=kvmeta_pb2.EndSessionTurnRequest.SerializeToString,
                response_deserializer=kvmeta_pb2.SessionResponse.FromString,
            ),
        }
        self._queue: deque[tuple[str, Message]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # Requests in flight whose turn start was queued: their chain tip.
        self._tips: dict[str, Tip] = {}
        self.stats: dict[str, int] = {
            "queued": 0,
            "sent": 0,
            "dropped": 0,
            "errors": 0,
            "timeouts": 0,
        }
        self._warned = -LOG_EVERY_S

    def __len__(self) -> int:
        return len(self._queue)

    # -- hooks (request path: never block, never raise) ----------------------------------
    def picked(self, ctx: RequestContext, view: RequestView) -> None:
        """A pick of ``ctx``'s request: its first queues the turn's start."""
        if ctx.request_id in self._tips:
            return
        req = turn_start(ctx, self.deployment)
        if req is not None and self._offer(START_TURN, req):
            self._tips[ctx.request_id] = tip_of(view)

    def finished(self, ctx: RequestContext, end: Ending) -> None:
        """The request is done: queue the turn's end (only when its start was queued)."""
        tip = self._tips.pop(ctx.request_id, None)
        if tip is None:
            return
        req = turn_end(ctx, self.deployment, status=end.status, tip=tip)
        if req is not None:
            self._offer(END_TURN, req)

    def _offer(self, method: str, req: Message) -> bool:
        if len(self._queue) >= self.buffer:
            self.stats["dropped"] += 1
            return False
        self._queue.append((method, req))
        self.stats["queued"] += 1
        self._wake.set()
        return True

    # -- sender --------------------------------------------------------------------------
    async def send_queued(self) -> int:
        """Send every queued call, in order; returns how many kvmeta accepted."""
        done = 0
        while self._queue:
            method, req = self._queue.popleft()
            try:
                await self._calls[method](req, timeout=self.deadline_s)
            except grpc.aio.AioRpcError as e:
                timeout = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                self.stats["timeouts" if timeout else "errors"] += 1
                self._warn(f"{e.code().name}: {e.details()}")
                continue
            except Exception as e:  # a broken channel must not stop the sender
                self.stats["errors"] += 1
                self._warn(repr(e))
                continue
            self.stats["sent"] += 1
            done += 1
        return done

    def _warn(self, what: str) -> None:
        now = self.clock()
        if now - self._warned >= LOG_EVERY_S:
            self._warned = now
            log.warning(
                "kvmeta session turn not recorded (%s); %d errors, %d timeouts so far",
                what,
                self.stats["errors"],
                self.stats["timeouts"],
            )

    async def _run(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            await self.send_queued()

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        await stop_tasks([self._task], grace_s=self.stop_grace_s, cancel_wait_s=1.0)
        self._task = None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.send_queued(), self.stop_grace_s)
