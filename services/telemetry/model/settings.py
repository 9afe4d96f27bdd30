"""Settings of telemetry's performance-model side (the lead nests :class:`ModelSettings` into
``TelemetrySettings`` as ``model``; Redis URL and stream prefix come from the service's
common settings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.common.perfmodel import DEFAULT_PROFILE
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE
from services.telemetry.model.fit import FitConfig

__all__ = ["ModelSettings", "ScrapeTarget"]


class ScrapeTarget(BaseModel):
    """An engine that publishes no load snapshots: its ``/metrics`` is scraped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment: str = Field(min_length=1)
    instance_id: str = Field(min_length=1)
    url: str = Field(min_length=1, description="engine base URL (…/metrics is scraped)")


class ModelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(DEFAULT_PROFILE, description="perfmodel profile used as the prior")
    min_samples: int = Field(50, ge=1, description="samples before a part leaves the prior")
    confident_samples: int = Field(200, ge=1, description="samples for full sample confidence")
    max_samples: int = Field(4000, ge=10, description="recent samples kept per part")
    prior_weight: float = Field(1.0, ge=0, description="the prior as pseudo-observations")
    holdout_every: int = Field(5, ge=2, description="every n-th sample is held out")
    max_error: float = Field(0.5, gt=0, description="held-out error at which confidence is 0")
    startup_prior_s: float = Field(60.0, ge=0, description="start-up time with no observation")
    refit_interval_s: float = Field(5.0, gt=0, description="how often fits are recomputed")
    deployments: list[str] = Field(
        default_factory=lambda: ["default"], description="deployments whose load streams to follow"
    )
    follow_load: bool = Field(True, description="follow {prefix}:load:{deployment}")
    follow_membership: bool = Field(True, description="follow {prefix}:membership")
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, description="engine KV block size (tokens)")
    scrape_endpoints: list[ScrapeTarget] = Field(default_factory=list)
    scrape_interval_s: float = Field(5.0, gt=0)
    scrape_timeout_s: float = Field(2.0, gt=0)
    # Recommendation.
    recommend_window_s: float = Field(300.0, gt=0, description="default traffic window")
    max_batch: int = Field(256, ge=1, description="engine max running sequences")
    max_utilization: float = Field(0.9, gt=0, lt=1, description="prefill utilisation bound")
    default_ttft_ms: float = Field(2000.0, ge=0, description="targets when no class is known")
    default_tpot_ms: float = Field(100.0, ge=0)
    default_percentile: float = Field(90.0, gt=0, lt=100)

    def fit_config(self) -> FitConfig:
        return FitConfig(
            min_samples=self.min_samples,
            confident_samples=self.confident_samples,
            max_samples=self.max_samples,
            prior_weight=self.prior_weight,
            holdout_every=self.holdout_every,
            max_error=self.max_error,
            startup_prior_s=self.startup_prior_s,
        )
