"""SLO goodput: score each endpoint by the probability that the request meets its SLOs there."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from services.common.routing.framework import CycleContext, by_instance
from services.common.routing.registry import (
    Params,
    PluginEnv,
    decode_model,
    model_version,
    prefill_tps,
    register,
)
from services.common.routing.types import EndpointView, RequestView

__all__ = ["SLOGoodput", "SLOGoodputParams", "meet_probability"]

_SQRT2 = math.sqrt(2.0)


def meet_probability(predicted_ms: float, target_ms: float, sigma: float) -> float:
    """P(actual <= target) when actual = predicted * exp(sigma * Z), Z standard normal (a
    log-normal error of relative spread ``sigma`` around the prediction). 1 for a
    prediction of 0 or less (nothing to wait for)."""
    if predicted_ms <= 0.0:
        return 1.0
    if target_ms <= 0.0:
        return 0.0
    z = math.log(target_ms / predicted_ms) / sigma
    return 0.5 * (1.0 + math.erf(z / _SQRT2))


class SLOGoodputParams(Params):
    # Log-normal spread of the actual TTFT around the predicted one (0.35: the actual is
    # within x/1.4 of the prediction about two times in three).
    sigma: float = Field(0.35, gt=0)
    # The same for the TPOT of the engine's decodes.
    tpot_sigma: float = Field(0.25, gt=0)
    # Decode steps before the first token reaches the client (engines that stream tokens in
    # chunks of k send the first after k - 1 more steps); added to the predicted TTFT.
    first_chunk_steps: int = Field(0, ge=0)
    # Output tokens still to come per running decode when the engine reports no tokens in
    # flight (its /metrics scrape carries none); the prefills it runs meanwhile are spread
    # over that many tokens.
    decode_tokens: int = Field(256, ge=1)
    # Floor of the per-decode remaining tokens derived from the engine's report.
    min_remaining_tokens: int = Field(16, ge=1)
    # Chunk size used to derive the model's prefill throughput (queued prefill tokens -> ms).
    chunk_tokens: int = Field(4096, gt=0)
    # Off: TTFT only.
    tpot: bool = True
    # When no candidate reaches this probability the request is hopeless everywhere (it
    # cannot be helped by where it goes). "others": it scores 0 everywhere, so the profile's
    # other scorers (ttft-cost among them) route it as they would without this one; "ttft":
    # it is scored by predicted TTFT ((min + eps) / (ttft + eps)). Never shed either way.
    hopeless_p: float = Field(0.02, ge=0, lt=1)
    hopeless: Literal["others", "ttft", "late"] = "others"
    epsilon_ms: float = Field(5.0, gt=0)
    # Only hopeless requests: a request some candidate gives ``hopeless_p`` scores 0
    # everywhere (the profile's other scorers place it as without this one).
    only_hopeless: bool = False


@register("slo-goodput", SLOGoodputParams)
class SLOGoodput:
    """Score = P(TTFT within the request's budget) x P(the engine's decodes stay within the
    request's TPOT target after taking this prefill), from the predicted TTFT of a
    ``ttft-cost`` plugin in the same profile (list one) and the perf model's decode steps.

    TTFT: predicted TTFT (+ ``first_chunk_steps`` decode steps) with a log-normal error of
    spread ``sigma``, against ``request.ttft_slo_ms``. TPOT: the engine's decode step at its
    batch plus this request (``running + unreported picks + 1`` sequences over its KV in use
    plus the prompt), plus the prefill it will run while they decode (the prefill queued
    there and this prompt's own) spread over the tokens each decode still has to emit
    (engine-reported tokens in flight, else ``decode_tokens``), with spread ``tpot_sigma``,
    against ``request.tpot_slo_ms``; 1 when the request has no TPOT target or the model
    prices no decode step. A request without a TTFT budget scores 0 everywhere (the other
    scorers decide); one no candidate gives ``hopeless_p`` scores 0 everywhere too (the
    profile's ttft-cost and prefix scorers place it), or with ``hopeless: ttft`` by
    predicted TTFT (the fastest first token wins), or with ``hopeless: late`` 1 where the
    queue alone (predicted TTFT less the request's own prefill) is already past its budget
    and 0 where it is not: work that misses anyway goes where others miss already, and
    instances still on time stay so. It is never shed. ``only_hopeless``: a request that
    is not hopeless scores 0 everywhere (the plugin only places the hopeless)."""

    def __init__(self, name: str, params: SLOGoodputParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self.model = env.perf_profile("")
        self._version = -1
        self.model_tps = 0.0
        self._sync()

    def _sync(self) -> None:
        v = model_version(self.model)
        if v != self._version:
            self.model_tps = prefill_tps(self.model, self.p.chunk_tokens)
            self._version = v

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        return by_instance(candidates, self.score_list(ctx, request, candidates))

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        budget = request.ttft_slo_ms
        if budget <= 0 or not candidates:
            return [0.0] * len(candidates)
        self._sync()
        preds = [ctx.predicted_ttft_ms.get(e.instance_id) for e in candidates]
        out = []
        for e, pred in zip(candidates, preds, strict=True):
            if pred is None:
                out.append(0.0)
                continue
            step = self._step_ms(e, request) if self.p.first_chunk_steps else 0.0
            p = meet_probability(pred + self.p.first_chunk_steps * step, budget, self.p.sigma)
            if p > 0.0 and self.p.tpot and request.tpot_slo_ms > 0:
                p *= self._tpot_probability(ctx, e, request)
            out.append(p)
        if max(out) >= self.p.hopeless_p:
            return [0.0] * len(out) if self.p.only_hopeless else out
        if self.p.hopeless == "others":
            return [0.0] * len(out)
        if self.p.hopeless == "late":
            return self._late(ctx, request, candidates, preds, budget)
        known = [p for p in preds if p is not None]
        if not known:
            return out
        eps = self.p.epsilon_ms
        lo = min(known) + eps
        return [0.0 if p is None else lo / (p + eps) for p in preds]

    @staticmethod
    def _late(
        ctx: CycleContext,
        request: RequestView,
        candidates: Sequence[EndpointView],
        preds: Sequence[float | None],
        budget: float,
    ) -> list[float]:
        """A hopeless request's scores with ``hopeless: late``: 1 where the queue alone
        already exceeds the budget (nothing arriving there meets it), 0 where requests can
        still meet theirs (kept for them)."""
        out = []
        for e, pred in zip(candidates, preds, strict=True):
            own = ctx.own_prefill_ms(e.instance_id, request.prompt_tokens)
            wait = None if pred is None or own is None else pred - own
            out.append(1.0 if wait is not None and wait >= budget else 0.0)
        return out

    def _step_ms(self, e: EndpointView, request: RequestView) -> float:
        """One decode step on ``e`` with this request in its batch (0: no decode model)."""
        dm = decode_model(self.model)
        if dm is None:
            return 0.0
        cap = int(getattr(self.model, "kv_capacity_tokens", 0))
        context = int(e.kv_usage * cap) + request.prompt_tokens
        return dm.decode_step_ms(e.running + e.reserved_requests + 1, context)

    def _tpot_probability(self, ctx: CycleContext, e: EndpointView, request: RequestView) -> float:
        step = self._step_ms(e, request)
        if step <= 0.0:
            return 1.0
        running = e.running + e.reserved_requests
        remaining = max(0, e.tokens_in_flight - e.pending_prefill_tokens)
        per_decode = remaining / running if running and remaining else self.p.decode_tokens
        per_decode = max(per_decode, self.p.min_remaining_tokens)
        own = ctx.own_prefill_ms(e.instance_id, request.prompt_tokens) or 0.0
        tps = self.model_tps
        queued = 1000.0 * e.pending_prefill / tps if tps > 0 else 0.0
        tpot = step + (own + queued) / per_decode
        return meet_probability(tpot, request.tpot_slo_ms, self.p.tpot_sigma)
