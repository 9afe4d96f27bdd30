"""Drain before removal: stop new requests to an instance, wait (bounded) until nothing is in
flight on it, and say whether it got there.

Which signal means "nothing in flight": a request is in flight while *either*

- a gateway replica holds it: picked, being forwarded or its answer still streaming back
  (the scheduler's ``Drain`` answer ``in_flight``, this replica's count; ``Drain`` is
  idempotent, so calling it again is the poll), or
- the engine holds it: running or queued there, whoever sent it (its ``/metrics``:
  ``sglang:num_running_reqs + num_queue_reqs`` or the vLLM equivalents, parsed by the
  gateway's own :func:`~services.common.engine_load.scrape_load`).

Neither alone is enough (the gateway does not see other clients or other replicas; the
engine does not see a request still in transit), so the instance is drained when every
scheduler answers 0 (or does not know it: NOT_FOUND) and the engine reports 0 running and 0
waiting in the same round. An unreachable scheduler is not "0": the wait goes on until the
timeout. An engine without load metrics leaves the schedulers' word alone.

Before any of this the caller announces DRAINING on the membership stream, which every
gateway replica follows; the ``Drain`` RPC makes the replicas we can reach stop at once.

Scale-in is drain and migrate: after the drain, :meth:`Drainer.migrate` asks kvmeta (when
the drainer has a :class:`~services.autoscaler.drivers.sessions.KVMetaSessions`) to move the
instance's agent sessions to the instances of its role that stay, before the driver removes
it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import grpc
from tideserve.v1 import scheduler_pb2, scheduler_pb2_grpc

from services.autoscaler.drivers.sessions import KVMetaSessions
from services.common.engine_load import scrape_load
from services.common.planner.driver_base import InstanceStatus
from services.common.security.channels import aio_channel

__all__ = ["DrainResult", "Drainer", "is_drained"]


@dataclass(frozen=True)
class DrainResult:
    """``drained``: nothing in flight was seen before the timeout; ``in_flight``: the last
    total seen (schedulers + engine; -1 when a scheduler could not be asked)."""

    drained: bool
    waited_s: float
    in_flight: int
    polls: int


def is_drained(scheduler_counts: Sequence[int | None], engine_count: int | None) -> bool:
    """True when every scheduler answered 0 (None = could not ask) and the engine reports 0
    (None = no load metrics: the schedulers decide)."""
    if any(c is None or c > 0 for c in scheduler_counts):
        return False
    return engine_count is None or engine_count == 0


class Drainer:
    """Drains instances through the schedulers at ``addresses`` (``host:port`` of each
    gateway replica's gRPC server; empty = only the engine's own load is watched)."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout_s: float = 60.0,
        poll_s: float = 0.2,
        rpc_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        channel: Callable[[str], grpc.aio.Channel] = aio_channel,
        sessions: KVMetaSessions | None = None,
    ) -> None:
        self.addresses = tuple(addresses)
        self.sessions = sessions
        self._make_channel = channel
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.rpc_timeout_s = rpc_timeout_s
        self._clock = clock
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._http: aiohttp.ClientSession | None = None

    def _stub(self, address: str) -> scheduler_pb2_grpc.SchedulerServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._make_channel(address)
        return scheduler_pb2_grpc.SchedulerServiceStub(channel)

    async def _ask(self, address: str, instance_id: str) -> int | None:
        """One idempotent ``Drain``: that replica's in-flight count, 0 when it does not know
        the instance, None when it cannot be asked."""
        try:
            resp = await self._stub(address).Drain(
                scheduler_pb2.DrainRequest(instance_id=instance_id), timeout=self.rpc_timeout_s
            )
        except grpc.aio.AioRpcError as e:
            return 0 if e.code() == grpc.StatusCode.NOT_FOUND else None
        return int(resp.in_flight)

    async def _engine(self, endpoint: str) -> int | None:
        if not endpoint:
            return None
        if self._http is None:
            self._http = aiohttp.ClientSession()
        load = await scrape_load(self._http, endpoint.rstrip("/"), self.rpc_timeout_s)
        return None if load is None else load.running + load.waiting

    async def drain(
        self, instance_id: str, endpoint: str, timeout_s: float | None = None
    ) -> DrainResult:
        """Drain ``instance_id`` (engine base URL ``endpoint``) and wait until
        :func:`is_drained` holds or ``timeout_s`` (default :attr:`timeout_s`) passes."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        t0 = self._clock()
        polls = 0
        while True:
            polls += 1
            counts = await asyncio.gather(*(self._ask(a, instance_id) for a in self.addresses))
            engine = await self._engine(endpoint)
            waited = self._clock() - t0
            if is_drained(counts, engine):
                return DrainResult(True, waited, 0, polls)
            if waited >= limit:
                unknown = any(c is None for c in counts)
                total = -1 if unknown else sum(c or 0 for c in counts) + (engine or 0)
                return DrainResult(False, waited, total, polls)
            await asyncio.sleep(self.poll_s)

    async def migrate(self, victim: InstanceStatus, peers: Sequence[InstanceStatus]) -> str:
        """Move the drained ``victim``'s agent sessions to ``peers`` (the instances of its
        role that stay); a summary line, "" when there was nothing to do or no kvmeta."""
        if self.sessions is None:
            return ""
        return await self.sessions.migrate(victim, peers)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None
