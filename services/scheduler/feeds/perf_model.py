"""Telemetry's fitted performance model into the gateway's predicted-TTFT plugins.

Every ``perf_model_refresh_s`` the feed asks telemetry's ``GetPerfModel`` for the
deployment's prefilling role (``ROLE_UNSPECIFIED``: prefill in P/D, else worker) and offers
the answer to the :class:`~services.scheduler.core.perf_switch.PerfModelSwitch`, which uses
it once its prefill confidence reaches ``perf_model_min_confidence`` (and goes back to the
static profile when it falls below). A failed call (telemetry down, UNIMPLEMENTED,
NOT_FOUND) keeps the model in use and is counted in ``stats``. The gRPC channel is opened
on first use, inside the running event loop (a grpc.aio channel belongs to the loop it was
made in), and closed by :meth:`stop`. ``stats``: ``refreshed``,
``switched``, ``errors``, ``implausible`` (confident fits refused as not a model of
prefill, logged once per run of them); ``source`` says which model prices now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc
from tideserve.v1 import telemetry_pb2

from services.common.perfcoef import from_pb
from services.common.security.channels import insecure_channel
from services.common.tasks import pause, stop_tasks
from services.scheduler.core.perf_switch import PerfModelSwitch

__all__ = ["GET_PERF_MODEL", "PerfModelFeed"]

log = logging.getLogger(__name__)

GET_PERF_MODEL = "/tideserve.v1.TelemetryService/GetPerfModel"


class PerfModelFeed:
    def __init__(
        self,
        address: str,
        switch: PerfModelSwitch,
        *,
        deployment: str,
        interval_s: float,
        deadline_s: float = 2.0,
        channel: Callable[[str], grpc.aio.Channel] = insecure_channel,
    ) -> None:
        self.address = address
        self.switch = switch
        self.deployment = deployment
        self.interval_s = interval_s
        self.deadline_s = deadline_s
        self._make_channel = channel
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self.stats: dict[str, int] = {"refreshed": 0, "switched": 0, "errors": 0, "implausible": 0}
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._logged_error = False
        self._logged_implausible = False

    async def refresh_once(self) -> bool:
        """One ``GetPerfModel``; whether the model in use changed."""
        if self._call is None:
            self._channel = self._make_channel(self.address)
            self._call = self._channel.unary_unary(
                GET_PERF_MODEL,
                request_serializer=telemetry_pb2.GetPerfModelRequest.SerializeToString,
                response_deserializer=telemetry_pb2.GetPerfModelResponse.FromString,
            )
        req = telemetry_pb2.GetPerfModelRequest(deployment=self.deployment)
        try:
            resp: telemetry_pb2.GetPerfModelResponse = await self._call(
                req, timeout=self.deadline_s
            )
        except grpc.RpcError as e:
            self.stats["errors"] += 1
            if not self._logged_error:
                log.warning("GetPerfModel(%s): %s; keeping the current model", self.deployment, e)
                self._logged_error = True
            return False
        self._logged_error = False
        self.stats["refreshed"] += 1
        m = resp.model
        fitted = from_pb(m)
        changed = self.switch.offer(fitted, m.prefill_confidence)
        bad = self.switch.refused_implausible
        if bad:
            self.stats["implausible"] += 1
            if not self._logged_implausible:
                log.warning(
                    "GetPerfModel(%s): the fit prices prefill at or below 0 (%s); not used",
                    self.deployment, fitted,
                )  # fmt: skip
        self._logged_implausible = bad
        if changed:
            self.stats["switched"] += 1
            log.info(
                "predicted TTFT now priced by the %s model (prefill confidence %.2f, %d samples)",
                self.switch.source, m.prefill_confidence, m.samples,
            )  # fmt: skip
        return changed

    async def _run(self) -> None:
        while not self._stopping.is_set():
            await self.refresh_once()
            if await pause(self._stopping, self.interval_s):
                return

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="perf-model-feed")

    async def stop(self) -> None:
        """Idempotent."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            await stop_tasks([task])
        channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            await channel.close()
