"""Planner configuration (one frozen model; the autoscaler settings embed it as ``planner``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PlannerConfig", "PolicyName", "PredictorName", "ReactiveConfig", "for_deployment"]

PredictorName = Literal["constant", "moving_average", "holt_winters"]
PolicyName = Literal["sla", "reactive"]


class ReactiveConfig(BaseModel):
    """Knobs of the reactive (KPA-like) policy, :mod:`.reactive` (Knative's defaults where it
    has one: 60 s stable and 6 s panic windows, panic at 2x, target utilisation 0.7)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stable_window_s: float = Field(default=60.0, gt=0, description="concurrency averaged over")
    panic_window_s: float = Field(default=6.0, gt=0, description="short window that panics")
    panic_threshold: float = Field(
        default=2.0, gt=1, description="panic when the panic window wants this x ready replicas"
    )
    target_concurrency: float = Field(
        default=0.0,
        ge=0,
        description="requests in flight per replica at 100%; 0 = derived from the perf model",
    )
    target_utilization: float = Field(
        default=0.7, gt=0, le=1, description="share of target_concurrency aimed at"
    )
    max_scale_up_rate: float = Field(
        default=10.0, gt=1, description="at most this x ready replicas per decision"
    )
    max_scale_down_rate: float = Field(
        default=2.0, gt=1, description="at most ready / this removed per decision"
    )


class PlannerConfig(BaseModel):
    """Knobs of the SLA planner. Times are seconds of the clock the planner is given."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: PolicyName = Field(
        default="sla",
        description="sla: the SLA planner (forecast, capacity at the SLO percentile); "
        "reactive: the KPA-like threshold autoscaler (planner/reactive.py)",
    )
    interval_s: float = Field(default=10.0, gt=0, description="seconds between ticks")
    window_s: float = Field(default=60.0, gt=0, description="telemetry window per tick")
    predictor: PredictorName = Field(default="holt_winters", description="load predictor")
    bucket_s: float = Field(
        default=600.0, gt=0, description="forecast resolution: observations are averaged per bucket"
    )
    season_s: float = Field(default=86_400.0, gt=0, description="seasonal period (the daily tide)")
    moving_average_buckets: int = Field(default=6, ge=1, description="moving_average: buckets")
    hw_alpha: float = Field(default=0.5, gt=0, le=1, description="Holt-Winters level smoothing")
    hw_beta: float = Field(default=0.05, ge=0, le=1, description="Holt-Winters trend smoothing")
    hw_gamma: float = Field(default=0.3, ge=0, le=1, description="Holt-Winters season smoothing")
    max_utilization: float = Field(
        default=0.85, gt=0, lt=1, description="ceiling on per-replica prefill utilisation"
    )
    decode_headroom: float = Field(
        default=0.9, gt=0, le=1, description="share of the TPOT target a decode step may use"
    )
    stream_interval: int = Field(
        default=1,
        ge=1,
        description="tokens in the engines' first streamed chunk (their --stream-interval): "
        "a client's first token waits for this many, so TTFT holds stream_interval - 1 "
        "decode steps besides the prefill",
    )
    first_chunk_share: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="with stream_interval > 1: share of the TTFT target the first chunk's "
        "decode steps may use; the prefill is sized for the rest",
    )
    scale_down_window_s: float = Field(
        default=300.0, ge=0, description="stabilisation: scale down to the window's max need"
    )
    cooldown_s: float = Field(default=120.0, ge=0, description="no scale-down after a change")
    hysteresis: float = Field(
        default=0.1, ge=0, lt=1, description="scale down only with this much spare capacity"
    )
    max_scale_down_step: float = Field(
        default=0.25, gt=0, le=1, description="share of a role removed per decision (>= 1)"
    )
    rate_trend: bool = Field(
        default=False,
        description="plan for at least the window's rate carried along its recent climb to "
        "now + lead (the window's mean trails a climb by half the window; planner/trend.py)",
    )
    startup_s_default: float = Field(
        default=30.0, ge=0, description="lead time when the perf model has no startup_s"
    )
    boost_relief: float = Field(
        default=0.7, gt=0, lt=1, description="attainment boost decays below this share of target"
    )
    session_kv_floor: bool = Field(
        default=True,
        description="never scale a role in below the instances whose KV (x "
        "session_kv_headroom) holds its active agent sessions' prefixes (a turn in flight, "
        "one ended recently, or a predicted return ahead; kvmeta's figure)",
    )
    session_kv_headroom: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="share of an instance's KV the active sessions' prefixes may fill "
        "(session_kv_floor)",
    )
    reactive: ReactiveConfig = Field(
        default_factory=ReactiveConfig, description="policy reactive: its knobs"
    )


def for_deployment(cfg: PlannerConfig, overrides: Mapping[str, Any]) -> PlannerConfig:
    """``cfg`` with a deployment's own settings (its spec's ``planner`` section,
    :meth:`~services.common.planner.spec.PlannerSpec.overrides`); ``cfg`` itself without any."""
    if not overrides:
        return cfg
    return PlannerConfig.model_validate({**cfg.model_dump(), **overrides})
