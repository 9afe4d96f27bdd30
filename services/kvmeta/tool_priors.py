"""Telemetry's tool-time distributions as priors of kvmeta's predictor (the shell).

kvmeta's :class:`~services.common.sessions.ToolTimePredictor` learns only from the session
RPCs and starts empty after a restart. Telemetry learns the same distributions from the
request records (``GetToolTimes``). :class:`ToolTimePriors` asks telemetry every
``refresh_s`` for one deployment's distributions at :data:`PRIOR_PERCENTILES`, only those
with the predictor's ``min_samples`` gaps, and installs the answer whole as the predictor's
priors (:meth:`~services.common.sessions.ToolTimePredictor.set_priors`; the rule of when a
prior answers is there). A failed call (telemetry away, an error, a malformed answer) keeps
the priors installed last; failures are logged at most once per ``log_every_s`` and never
stop kvmeta. An empty answer (telemetry restarted, nothing learned yet) clears the priors.

kvmeta's predictor is one for every deployment its sessions name, so priors come from one
deployment (setting ``tool_times_deployment``); a kvmeta whose sessions span several
deployments borrows that one's tool times for all of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc
from tideserve.v1 import telemetry_pb2, telemetry_pb2_grpc

from services.common.sessions import GapQuantiles, ToolTimePredictor
from services.common.tasks import pause

__all__ = ["PRIOR_PERCENTILES", "GrpcToolTimes", "ToolTimePriors", "ToolTimeSource"]

log = logging.getLogger(__name__)

PRIOR_PERCENTILES = (0.5, 0.75, 0.9, 0.95, 0.99)
"""The grid asked of telemetry; other percentiles are interpolated on it."""

Table = tuple[tuple[float, ...], list[GapQuantiles]]
"""The percentiles answered and one row per distribution, its seconds at them."""


class ToolTimeSource(Protocol):
    async def tool_times(
        self, deployment: str, percentiles: Sequence[float], min_samples: int
    ) -> Table: ...


class GrpcToolTimes:
    """:class:`ToolTimeSource` over ``TelemetryService.GetToolTimes``."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        self._channel = channel
        self._stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
        self._timeout_s = timeout_s

    async def tool_times(
        self, deployment: str, percentiles: Sequence[float], min_samples: int
    ) -> Table:
        resp = await self._stub.GetToolTimes(
            telemetry_pb2.GetToolTimesRequest(
                deployment=deployment, percentiles=list(percentiles), min_samples=min_samples
            ),
            timeout=self._timeout_s,
        )
        rows = [
            GapQuantiles(t.agent, t.tool, int(t.samples), tuple(t.seconds)) for t in resp.tool_times
        ]
        return tuple(resp.percentiles) or tuple(percentiles), rows

    async def close(self) -> None:
        await self._channel.close()


class ToolTimePriors:
    """Keeps the predictor's priors refreshed from a :class:`ToolTimeSource` (module doc);
    ``clock`` (monotonic seconds) only paces the failure log."""

    def __init__(
        self,
        predictor: ToolTimePredictor,
        source: ToolTimeSource,
        *,
        deployment: str,
        refresh_s: float,
        clock: Callable[[], float],
        percentiles: Sequence[float] = PRIOR_PERCENTILES,
        log_every_s: float = 60.0,
    ) -> None:
        self._predictor = predictor
        self._source = source
        self.deployment = deployment
        self.refresh_s = refresh_s
        self._clock = clock
        self.percentiles = tuple(percentiles)
        self.log_every_s = log_every_s
        self.refreshes = 0
        self.failures = 0
        self._last_log: float | None = None

    async def refresh(self) -> bool:
        """Ask once and install the answer; False (logged, paced) when that failed."""
        try:
            qs, rows = await self._source.tool_times(
                self.deployment, self.percentiles, self._predictor.min_samples
            )
            self._predictor.set_priors(qs, rows)
        except Exception as exc:  # any failure keeps the old priors; kvmeta runs on
            self._failed(exc)
            return False
        self.refreshes += 1
        return True

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        now = self._clock()
        if self._last_log is not None and now - self._last_log < self.log_every_s:
            return
        self._last_log = now
        what = (
            f"{exc.code().name}: {exc.details()}"
            if isinstance(exc, grpc.aio.AioRpcError)
            else repr(exc)
        )
        log.warning(
            "tool-time priors from telemetry (deployment %r) not refreshed: %s "
            "(%d failures so far; the last priors stay)",
            self.deployment,
            what,
            self.failures,
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Refresh now and every ``refresh_s`` until ``stopping`` is set."""
        while not stopping.is_set():
            await self.refresh()
            if await pause(stopping, self.refresh_s):
                return
