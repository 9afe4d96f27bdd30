"""Domain <-> protobuf for the telemetry servicer (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from tideserve.v1 import telemetry_pb2

from services.common.sessions import GapQuantiles
from services.telemetry.query import Window
from services.telemetry.windows.bucket import RELATIVE_ACCURACY
from services.telemetry.windows.stats import ClassAttainment, Filters, Percentiles, WindowStats

__all__ = ["filters_of", "tool_times_response", "window_response", "window_stats_pb"]


def filters_of(request: telemetry_pb2.QueryWindowRequest) -> Filters:
    return Filters(request.deployment, request.role, request.slo_class, request.tenant)


def _pct(p: Percentiles) -> telemetry_pb2.Percentiles:
    return telemetry_pb2.Percentiles(mean=p.mean, p50=p.p50, p90=p.p90, p99=p.p99)


def _cls(c: ClassAttainment) -> telemetry_pb2.ClassAttainment:
    return telemetry_pb2.ClassAttainment(
        slo_class=c.slo_class,
        percentile=c.percentile,
        ttft_target_ms=c.ttft_target_ms,
        tpot_target_ms=c.tpot_target_ms,
        ttft_ms=c.ttft_ms,
        tpot_ms=c.tpot_ms,
        ttft_attainment=c.ttft_attainment,
        tpot_attainment=c.tpot_attainment,
        met=c.met,
    )


def window_stats_pb(s: WindowStats) -> telemetry_pb2.WindowStats:
    return telemetry_pb2.WindowStats(
        deployment=s.deployment,
        role=s.role,
        slo_class=s.slo_class,
        tenant=s.tenant,
        start_ms=s.start_ms,
        end_ms=s.end_ms,
        requests=s.requests,
        request_rate_rps=s.request_rate_rps,
        input_tokens_per_s=s.input_tokens_per_s,
        output_tokens_per_s=s.output_tokens_per_s,
        input_tokens=_pct(s.input_tokens),
        output_tokens=_pct(s.output_tokens),
        queue_ms=_pct(s.queue_ms),
        ttft_ms=_pct(s.ttft_ms),
        tpot_ms=_pct(s.tpot_ms),
        e2e_ms=_pct(s.e2e_ms),
        kv_transfer_ms=_pct(s.kv_transfer_ms),
        cache_hit_ratio=s.cache_hit_ratio,
        cached_tokens_abs_error=s.cached_tokens_abs_error,
        cached_tokens_error_ratio=s.cached_tokens_error_ratio,
        goodput_rps=s.goodput_rps,
        slo_attainment=s.slo_attainment,
        error_rate=s.error_rate,
        shed_rate=s.shed_rate,
        classes=[_cls(c) for c in s.classes],
    )


def window_response(w: Window) -> telemetry_pb2.QueryWindowResponse:
    return telemetry_pb2.QueryWindowResponse(
        total=window_stats_pb(w.total),
        slices=[window_stats_pb(s) for s in w.slices],
        relative_accuracy=RELATIVE_ACCURACY,
        source=w.source,
    )


def tool_times_response(
    percentiles: Sequence[float], rows: Sequence[GapQuantiles], sessions: int
) -> telemetry_pb2.GetToolTimesResponse:
    return telemetry_pb2.GetToolTimesResponse(
        percentiles=list(percentiles),
        tool_times=[
            telemetry_pb2.ToolTime(
                agent=r.agent, tool=r.tool, samples=r.samples, seconds=list(r.seconds)
            )
            for r in rows
        ],
        sessions_tracked=sessions,
    )
