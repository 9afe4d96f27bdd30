"""Predicted-TTFT cost (Mooncake Conductor style) and the SLO feasibility filter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from services.scheduler.routing.framework import CycleContext
from services.scheduler.routing.registry import Params, PluginEnv, PrefillModel, register
from services.scheduler.routing.types import EndpointView, RequestView, Shed


class TTFTCostParams(Params):
    # Name in services.common.perfmodel.PROFILES; "" = its DEFAULT_PROFILE.
    perf_profile: str = ""
    # Smoothing added to costs before taking min/cost (keeps near-zero costs comparable).
    epsilon_ms: float = Field(5.0, gt=0)
    # Prefer the engine-reported prefill throughput over the model's when it is > 0.
    use_engine_throughput: bool = True
    # Chunk size used to derive the model's prefill throughput.
    chunk_tokens: int = Field(4096, gt=0)


def predict_ttft_ms(
    model: PrefillModel,
    model_tokens_per_s: float,
    e: EndpointView,
    prompt_tokens: int,
    cached_tokens: int,
    use_engine_throughput: bool = True,
) -> float:
    """Queue wait (prefill tokens ahead / prefill throughput) + prefill of the uncached suffix."""
    cached = max(0, min(cached_tokens, prompt_tokens))
    tput = e.prefill_tokens_per_s if use_engine_throughput and e.prefill_tokens_per_s > 0 else 0.0
    tput = tput or model_tokens_per_s
    wait_ms = 1000.0 * e.pending_prefill / tput if tput > 0 else 0.0
    return wait_ms + model.prefill_ms(prompt_tokens - cached, cached)


@register("ttft-cost", TTFTCostParams)
class TTFTCost:
    """Predicted time to first token per endpoint: wait for the prefill tokens queued ahead
    (engine + this gateway's reservations) at the endpoint's prefill throughput, plus the
    model's prefill time of the prompt minus the cached tokens estimated by the prefix
    plugins (so list a prefix plugin in the same profile). Score = (min + eps) / (cost + eps)
    over the candidates: the cheapest scores 1, twice as slow about 0.5. Records the
    prediction in ``ctx.predicted_ttft_ms`` for the SLO filter and the response."""

    phase = 1  # after the prefix preparers

    # prefill_ms memo (uncached, cached) -> ms, shared by cycles; cleared when full.
    memo_max = 65_536

    def __init__(self, name: str, params: TTFTCostParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self.model = env.perf_profile(params.perf_profile)
        self.model_tps = 1000.0 * params.chunk_tokens / self.model.prefill_ms(params.chunk_tokens)
        self._memo: dict[tuple[int, int], float] = {}

    def _prefill_ms(self, uncached: int, cached: int) -> float:
        key = (uncached, cached)
        p = self._memo.get(key)
        if p is None:
            if len(self._memo) >= self.memo_max:
                self._memo.clear()
            p = self._memo[key] = self.model.prefill_ms(uncached, cached)
        return p

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        # prefill_ms depends only on the cached count, shared by most candidates.
        prefill: dict[int, float] = {}
        n = request.prompt_tokens
        get = ctx.cached_tokens.get
        out = ctx.predicted_ttft_ms
        use_engine = self.p.use_engine_throughput
        model_tps = self.model_tps
        for e in candidates:
            cached = get(e.instance_id, 0)
            cached = 0 if cached < 0 else n if cached > n else cached
            p = prefill.get(cached)
            if p is None:
                p = prefill[cached] = self._prefill_ms(n - cached, cached)
            pending = e.pending_prefill_tokens + e.reserved_tokens
            if pending:
                tput = e.prefill_tokens_per_s if use_engine else 0.0
                tput = tput if tput > 0 else model_tps
                out[e.instance_id] = (1000.0 * pending / tput if tput > 0 else 0.0) + p
            else:
                out[e.instance_id] = 0.0 + p

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        if not candidates:
            return {}
        return dict(
            zip(
                (e.instance_id for e in candidates),
                self.score_list(ctx, request, candidates),
                strict=True,
            )
        )

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        """:meth:`score` aligned with ``candidates``."""
        if not candidates:
            return []
        get = ctx.predicted_ttft_ms.get
        eps = self.p.epsilon_ms
        costs = [get(e.instance_id, 0.0) + eps for e in candidates]
        lo = min(costs)
        return [lo / c for c in costs]


class SLOFilterParams(Params):
    # Feasible when predicted TTFT <= slack * the request's TTFT budget.
    slack: float = Field(1.0, gt=0)
    min_retry_after_ms: int = Field(100, ge=0)
    max_retry_after_ms: int = Field(30_000, ge=0)


@register("ttft-slo", SLOFilterParams)
class TTFTSLOFilter:
    """Keeps endpoints whose predicted TTFT (from a ttft-cost plugin in the same profile)
    fits the request's budget (``request.ttft_slo_ms``); when none does, returns
    :class:`Shed` with retry_after_ms = the best endpoint's overshoot, clamped. Requests
    without a budget, or endpoints without a prediction, pass."""

    def __init__(self, name: str, params: SLOFilterParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView] | Shed:
        budget = request.ttft_slo_ms * self.p.slack
        if request.ttft_slo_ms <= 0 or not candidates:
            return candidates
        preds = [ctx.predicted_ttft_ms.get(e.instance_id) for e in candidates]
        keep = [e for e, p in zip(candidates, preds, strict=True) if p is None or p <= budget]
        if keep:
            return keep
        best = min(p for p in preds if p is not None)
        retry = int(min(max(best - budget, self.p.min_retry_after_ms), self.p.max_retry_after_ms))
        return Shed(
            f"TTFT SLO infeasible: best predicted {best:.0f} ms > budget {budget:.0f} ms",
            retry,
        )
