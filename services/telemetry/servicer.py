"""gRPC servicer of ``tideserve.v1.TelemetryService``: a thin translation layer.

``ReportRecords``, ``QueryWindow`` and ``GetSession`` translate protobuf to the ingest path
and window queries; ``GetPerfModel``/``GetRecommendation`` go to the :class:`ModelRpc` when
one is wired, else UNIMPLEMENTED, and ``GetToolTimes`` to the :class:`ToolTimes` learner. Without ``postgres_url`` there is nowhere to store records:
``ReportRecords`` and ``GetSession`` answer FAILED_PRECONDITION.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import grpc
import psycopg
from tideserve.v1 import events_pb2, telemetry_pb2, telemetry_pb2_grpc

from services.common.streams import DeadLetters, encode_entry
from services.telemetry.ingest.pipeline import Ingest
from services.telemetry.ports import ModelRpc
from services.telemetry.query import WindowQuery
from services.telemetry.tooltimes import DEFAULT_PERCENTILES, ToolTimes
from services.telemetry.translate import filters_of, tool_times_response, window_response

__all__ = ["SERVICE_NAME", "TelemetryServicer", "add_to_server"]

SERVICE_NAME: str = telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"].full_name
"""Full gRPC name, ``tideserve.v1.TelemetryService`` (health and reflection use it)."""

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

if TYPE_CHECKING:  # the generated grpc module is untyped; keep ``Any`` out of the class
    _Base = object
else:
    _Base = telemetry_pb2_grpc.TelemetryServiceServicer

_NO_DB = "telemetry runs without postgres_url: records cannot be stored or read"


async def _abort(context: Ctx, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # context.abort raises


class TelemetryServicer(_Base):
    """``TelemetryService``: per-request records, windows, the performance model and
    recommendations. ``report_batch``: records per ingest transaction in ReportRecords."""

    def __init__(
        self,
        query: WindowQuery,
        ingest: Ingest | None = None,
        *,
        model: ModelRpc | None = None,
        tool_times: ToolTimes | None = None,
        dead: DeadLetters | None = None,
        report_batch: int = 2000,
        wall: Callable[[], float],
    ) -> None:
        self._query = query
        self._ingest = ingest
        self._model = model
        self._tool_times = tool_times
        self._dead = dead
        self._batch = report_batch
        self._wall = wall

    async def ReportRecords(
        self, request_iterator: AsyncIterator[events_pb2.RequestRecord], context: Ctx
    ) -> telemetry_pb2.ReportRecordsResponse:
        if self._ingest is None:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, _NO_DB)
        out = telemetry_pb2.ReportRecordsResponse()
        batch: list[events_pb2.RequestRecord] = []
        async for record in request_iterator:
            batch.append(record)
            if len(batch) >= self._batch:
                await self._report(batch, out, context)
                batch = []
        if batch:
            await self._report(batch, out, context)
        return out

    async def _report(
        self,
        batch: list[events_pb2.RequestRecord],
        out: telemetry_pb2.ReportRecordsResponse,
        context: Ctx,
    ) -> None:
        assert self._ingest is not None
        try:
            result = await self._ingest.ingest(batch)
        except psycopg.Error as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"postgres: {exc}".splitlines()[0])
        out.accepted += result.accepted
        out.duplicates += result.duplicates
        out.rejected += len(result.rejected)
        for index, why in result.rejected:
            rec = batch[index]
            line = why.line(rec.request_id)
            out.errors.append(line)
            if self._dead is not None:
                await self._dead.put(f"rpc:{rec.request_id}", encode_entry(rec), line)

    async def QueryWindow(
        self, request: telemetry_pb2.QueryWindowRequest, context: Ctx
    ) -> telemetry_pb2.QueryWindowResponse:
        if not request.window_s > 0:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"window_s must be > 0, got {request.window_s}",
            )
        if request.role not in ("", "worker", "prefill", "decode"):
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"role must be worker, prefill, decode or empty, got {request.role!r}",
            )
        try:
            window = await self._query.query(filters_of(request), request.window_s, request.end_ms)
        except psycopg.Error as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"postgres: {exc}".splitlines()[0])
        return window_response(window)

    async def GetSession(
        self, request: telemetry_pb2.GetSessionRequest, context: Ctx
    ) -> telemetry_pb2.GetSessionResponse:
        if not request.session_id:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "session_id is required")
        if request.limit < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        if self._ingest is None:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, _NO_DB)
        try:
            turns = await self._ingest.store.session(
                request.session_id, request.limit, request.tenant
            )
        except psycopg.Error as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"postgres: {exc}".splitlines()[0])
        if not turns:
            await _abort(
                context, grpc.StatusCode.NOT_FOUND, f"no record of session {request.session_id!r}"
            )
        return telemetry_pb2.GetSessionResponse(turns=turns)

    async def GetPerfModel(
        self, request: telemetry_pb2.GetPerfModelRequest, context: Ctx
    ) -> telemetry_pb2.GetPerfModelResponse:
        if self._model is None:
            await _abort(context, grpc.StatusCode.UNIMPLEMENTED, "no performance model is wired")
        try:
            return self._model.perf_model(request, int(self._wall() * 1000))
        except LookupError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))

    async def GetRecommendation(
        self, request: telemetry_pb2.GetRecommendationRequest, context: Ctx
    ) -> telemetry_pb2.GetRecommendationResponse:
        if self._model is None:
            await _abort(context, grpc.StatusCode.UNIMPLEMENTED, "no recommendation model is wired")
        try:
            return self._model.recommendation(request, int(self._wall() * 1000))
        except LookupError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except ValueError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def GetToolTimes(
        self, request: telemetry_pb2.GetToolTimesRequest, context: Ctx
    ) -> telemetry_pb2.GetToolTimesResponse:
        if self._tool_times is None:
            await _abort(context, grpc.StatusCode.UNIMPLEMENTED, "no tool-time learner is wired")
        qs = tuple(request.percentiles) or DEFAULT_PERCENTILES
        if request.min_samples < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "min_samples must be >= 0")
        try:
            rows = self._tool_times.table(request.deployment, qs, request.min_samples)
        except ValueError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return tool_times_response(qs, rows, self._tool_times.sessions_tracked)


def add_to_server(servicer: TelemetryServicer, server: grpc.aio.Server) -> str:
    """Register ``servicer`` on ``server``; returns :data:`SERVICE_NAME`."""
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(servicer, server)
    return SERVICE_NAME
