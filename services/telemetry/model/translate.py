"""Protobuf <-> model core (pure): a :class:`RoleFit` as a ``PerfModel``, a traffic window
as a :class:`TrafficMix` and SLO classes, a :class:`Recommendation` as the response."""

from __future__ import annotations

from collections.abc import Sequence

from tideserve.v1 import telemetry_pb2

from services.telemetry.model.fit import RoleFit
from services.telemetry.model.recommend import Recommendation, SloClass, TrafficMix

__all__ = ["perf_model_pb", "recommendation_pb", "slo_classes", "traffic_mix"]


def perf_model_pb(
    fit: RoleFit, *, deployment: str, role: int, profile: str, kv_bytes_per_token: int
) -> telemetry_pb2.PerfModel:
    c = fit.coefficients
    return telemetry_pb2.PerfModel(
        profile=profile,
        deployment=deployment,
        role=role,  # type: ignore[arg-type]
        prefill_base_ms=c.prefill_base_ms,
        prefill_ms_per_token=c.prefill_ms_per_token,
        prefill_ms_per_token2=c.prefill_ms_per_token2,
        decode_base_ms=c.decode_base_ms,
        decode_ms_per_seq=c.decode_ms_per_seq,
        decode_ms_per_ktoken=c.decode_ms_per_ktoken,
        transfer_base_ms=c.transfer_base_ms,
        transfer_ms_per_mb=c.transfer_ms_per_mb,
        kv_bytes_per_token=kv_bytes_per_token,
        samples=fit.prefill.samples + fit.decode.samples + fit.transfer.samples,
        startup_s=fit.startup_s,
        startup_samples=fit.startup_samples,
        prefill_confidence=fit.prefill.confidence,
        decode_confidence=fit.decode.confidence,
        prefill_error=fit.prefill.error,
        decode_error=fit.decode.error,
        fitted_ms=fit.fitted_ms,
    )


def traffic_mix(w: telemetry_pb2.WindowStats) -> TrafficMix:
    return TrafficMix(
        rate_rps=max(0.0, w.request_rate_rps),
        input_mean=max(0.0, w.input_tokens.mean),
        input_p50=max(0.0, w.input_tokens.p50),
        input_p90=max(0.0, w.input_tokens.p90),
        output_mean=max(0.0, w.output_tokens.mean),
        hit_ratio=min(1.0, max(0.0, w.cache_hit_ratio)),
    )


def slo_classes(w: telemetry_pb2.WindowStats, default: SloClass) -> list[SloClass]:
    """The window's classes with a target (``default`` when none has one)."""
    out = [
        SloClass(c.slo_class or "default", c.percentile or default.percentile,
                 c.ttft_target_ms, c.tpot_target_ms)
        for c in w.classes
        if c.ttft_target_ms > 0 or c.tpot_target_ms > 0
    ]  # fmt: skip
    return out or [default]


def recommendation_pb(
    r: Recommendation, mix: TrafficMix, extra_reasons: Sequence[str] = ()
) -> telemetry_pb2.GetRecommendationResponse:
    return telemetry_pb2.GetRecommendationResponse(
        prefill_replicas=r.prefill_replicas,
        decode_replicas=r.decode_replicas,
        worker_replicas=r.worker_replicas,
        reasons=[*r.reasons, *extra_reasons],
        binding_constraint=r.binding,
        pd_ratio=r.pd_ratio,
        request_rate_rps=mix.rate_rps,
        mean_input_tokens=mix.input_mean,
        mean_output_tokens=mix.output_mean,
        cache_hit_ratio=mix.hit_ratio,
    )
