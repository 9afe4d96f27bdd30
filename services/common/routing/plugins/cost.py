"""Predicted-TTFT cost (Mooncake Conductor style) and the SLO feasibility filter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from services.common.routing.framework import CycleContext, by_instance
from services.common.routing.plugins.pending import PendingPicks
from services.common.routing.registry import (
    Params,
    PluginEnv,
    model_version,
    prefill_tps,
    register,
)
from services.common.routing.types import EndpointView, Pick, RequestView, Shed


class TTFTCostParams(Params):
    # Name in services.common.perfmodel.PROFILES; "" = its DEFAULT_PROFILE.
    perf_profile: str = ""
    # Smoothing added to costs before taking min/cost (keeps near-zero costs comparable).
    epsilon_ms: float = Field(5.0, gt=0)
    # Let an engine-reported prefill throughput raise the model's. Engines report what they
    # achieved over a recent window (idle time included), a lower bound of their capacity:
    # below the model's it says the engine was not busy, not that it is slow, so the larger
    # of the two prices the queue.
    use_engine_throughput: bool = True
    # Chunk size used to derive the model's prefill throughput.
    chunk_tokens: int = Field(4096, gt=0)
    # Interference (0 = off): rank endpoints by predicted TTFT + interference * k * own
    # prefill, where k = this gateway's picks on the endpoint still waiting for their first
    # byte. Engines batch a new prompt's prefill chunks with the first decode steps of the
    # requests already there, so each of those k first responses arrives about that much
    # later. ``predicted_ttft_ms`` (SLO filter, response) stays the request's own TTFT.
    interference: float = Field(0.0, ge=0)
    # Recompute (0 = off): also add recompute * (own prefill - the cheapest candidate's own
    # prefill): prefill work a cache miss adds is fleet capacity later requests wait for.
    recompute: float = Field(0.0, ge=0)
    # Decode contention (0 = off): also add decode * running * own prefill: the engine
    # batches this prompt's prefill chunks with the decode steps of the requests it runs, so
    # each of them streams that much later (with long contexts, their TPOT is mostly this).
    decode: float = Field(0.0, ge=0)
    # KV pressure (0 = off): when the prompt plus its output does not fit in the instance's
    # free KV (1 - kv_usage of ``kv_capacity_tokens``, 0 = the perf model's), add
    # kv_pressure * the prefill of the whole prompt: it waits for memory, or evicts cached
    # prefixes that later requests recompute.
    kv_pressure: float = Field(0.0, ge=0)
    kv_capacity_tokens: int = Field(0, ge=0)
    # Picks not settled after this long stop counting (their outcome was never reported).
    awaiting_ttl_s: float = Field(600.0, gt=0)


@register("ttft-cost", TTFTCostParams)
class TTFTCost:
    """Predicted time to first token per endpoint: wait for the prefill tokens queued ahead
    (engine + this gateway's reservations) at the larger of the engine's reported and the
    model's prefill throughput, plus the model's prefill time of the prompt minus the cached
    tokens estimated by the prefix plugins (so list a prefix plugin in the same profile),
    less those an earlier request is still prefilling there (``ctx.unfinished_tokens``, from
    a prefix estimate with ``unfinished``: not cached yet, priced as computed again).
    Score = (min + eps) / (cost + eps) over the candidates: the cheapest scores 1, twice as
    slow about 0.5. Records the prediction in ``ctx.predicted_ttft_ms`` for the SLO filter
    and the response.

    With ``interference > 0`` the cost also counts the delay this prompt's prefill adds to
    the first responses of the requests this gateway sent to the endpoint that have not
    answered yet (``interference * k * own prefill``); the plugin then counts its own
    picks per target instance (``on_pick``) until they settle (``on_settle``: first byte,
    failure or release), or for at most ``awaiting_ttl_s``. With ``recompute > 0`` it adds
    ``recompute * (own prefill - cheapest own prefill)``: the fleet pays for a cache miss
    with capacity too. With ``decode > 0`` it adds ``decode * (running + unreported picks) *
    own prefill`` (the prompt's prefill chunks stall every decode there), and with
    ``kv_pressure > 0`` ``kv_pressure *`` the whole prompt's prefill where prompt +
    max_tokens does not fit in the free KV. All of them only change the ranking, never
    ``ctx.predicted_ttft_ms``."""

    phase = 1  # after the prefix preparers

    # prefill_ms memo (uncached, cached) -> ms, shared by cycles; cleared when full.
    memo_max = 65_536

    def __init__(self, name: str, params: TTFTCostParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self.model = env.perf_profile(params.perf_profile)
        self._memo: dict[tuple[int, int], float] = {}
        self._version = -1
        self.model_tps = 0.0
        # KV pressure: the instance's KV capacity in tokens (0: unknown, the term is off)
        self.kv_capacity = params.kv_capacity_tokens or int(
            getattr(self.model, "kv_capacity_tokens", 0)
        )
        # Whether the ranking cost differs from the predicted TTFT (any extra term on).
        p = params
        self.ranked = p.interference > 0 or p.recompute > 0 or p.decode > 0 or p.kv_pressure > 0
        self._sync()
        # interference: this gateway's picks per instance not answered yet
        self._awaiting = PendingPicks(params.awaiting_ttl_s)
        # This cycle's ranking cost per instance (interference or recompute > 0).
        self._cost: dict[str, float] = {}

    def _sync(self) -> None:
        """Recompute what derives from the model when it changed (the fitted model)."""
        v = model_version(self.model)
        if v != self._version:
            self._memo.clear()
            self.model_tps = prefill_tps(self.model, self.p.chunk_tokens)
            self._version = v

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
        self._sync()
        # prefill_ms depends only on the cached count, shared by most candidates.
        prefill: dict[int, float] = {}
        ctx.prefill_ms_by_cached = prefill
        n = request.prompt_tokens
        get = ctx.cached_tokens.get
        unfinished = ctx.unfinished_tokens.get if ctx.unfinished_tokens else None
        out = ctx.predicted_ttft_ms
        use_engine = self.p.use_engine_throughput
        model_tps = self.model_tps
        ranked = self.ranked
        owns: list[float] = []  # each candidate's own prefill (ranking only)
        ttfts: list[float] = []  # each candidate's predicted TTFT (ranking only)
        for e in candidates:
            iid = e.instance_id
            cached = get(iid, 0)
            if unfinished is not None:  # still being prefilled there: computed again
                cached -= unfinished(iid, 0)
            cached = 0 if cached < 0 else n if cached > n else cached
            p = prefill.get(cached)
            if p is None:
                p = prefill[cached] = self._prefill_ms(n - cached, cached)
            pending = e.pending_prefill_tokens + e.reserved_tokens
            if pending:
                tput = model_tps
                if use_engine and e.prefill_tokens_per_s > tput:
                    tput = e.prefill_tokens_per_s
                t = (1000.0 * pending / tput if tput > 0 else 0.0) + p
            else:
                t = 0.0 + p
            out[iid] = t
            if ranked:
                owns.append(p)
                ttfts.append(t)
        if ranked:
            cost = self._cost
            cost.clear()
            beta, gamma, delta = self.p.interference, self.p.recompute, self.p.decode
            k = self._awaiting.totals.get
            least = min(prefill.values(), default=0.0)
            for e, own, t in zip(candidates, owns, ttfts, strict=True):
                iid = e.instance_id
                c = t + beta * k(iid, 0) * own + gamma * (own - least)
                if delta:
                    c += delta * (e.running + e.reserved_requests) * own
                cost[iid] = c
            if self.p.kv_pressure:
                self._add_kv_pressure(request, candidates, cost)

    def _add_kv_pressure(
        self, request: RequestView, candidates: Sequence[EndpointView], cost: dict[str, float]
    ) -> None:
        """+ kv_pressure * the whole prompt's prefill where it does not fit in free KV."""
        n = request.prompt_tokens
        need = n + request.max_tokens
        cap = self.kv_capacity
        if cap <= 0:
            return
        penalty = self.p.kv_pressure * self._prefill_ms(n, 0)
        for e in candidates:
            if need > (1.0 - e.kv_usage) * cap:
                cost[e.instance_id] += penalty

    def awaiting(self, instance_id: str) -> int:
        """This gateway's picks on ``instance_id`` not settled yet (interference only)."""
        return self._awaiting.totals.get(instance_id, 0)

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        if self.p.interference <= 0:
            return
        target = (pick.prefill or pick.decode).endpoint.instance_id
        self._awaiting.add(request.request_id, target, 1, now)

    def on_settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """The pick answered or failed: it no longer waits for its first byte."""
        self._awaiting.drop(request.request_id)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        if not candidates:
            return {}
        return by_instance(candidates, self.score_list(ctx, request, candidates))

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        """:meth:`score` aligned with ``candidates``."""
        if not candidates:
            return []
        get = self._cost.get if self.ranked else ctx.predicted_ttft_ms.get
        eps = self.p.epsilon_ms
        costs = [get(e.instance_id, 0.0) + eps for e in candidates]
        lo = min(costs)
        return [lo / c for c in costs]


class SLOFilterParams(Params):
    # Feasible when predicted TTFT <= slack * the request's TTFT budget.
    slack: float = Field(1.0, gt=0)
    min_retry_after_ms: int = Field(100, ge=0)
    max_retry_after_ms: int = Field(30_000, ge=0)
    # A request whose own prefill misses the budget even on an idle endpoint (a very long
    # uncached prompt): "serve" it best effort (a retry could never meet the SLO), or "shed".
    infeasible_idle: Literal["serve", "shed"] = "serve"


@register("ttft-slo", SLOFilterParams)
class TTFTSLOFilter:
    """Keeps endpoints whose predicted TTFT (from a ttft-cost plugin in the same profile)
    fits the request's budget (``request.ttft_slo_ms``); when none does because of load
    (Mooncake Conductor's early rejection), returns :class:`Shed` with retry_after_ms = the
    best endpoint's overshoot, clamped. When none could even idle (its own prefill alone
    exceeds the budget everywhere), ``infeasible_idle`` decides: "serve" keeps every
    candidate, "shed" refuses. Requests without a budget, or endpoints without a
    prediction, pass."""

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
        if self.p.infeasible_idle == "serve":
            n = request.prompt_tokens
            own = [ctx.own_prefill_ms(e.instance_id, n) for e in candidates]
            if all(p is not None and p > budget for p in own):
                return candidates
        best = min(p for p in preds if p is not None)
        retry = int(min(max(best - budget, self.p.min_retry_after_ms), self.p.max_retry_after_ms))
        return Shed(
            f"TTFT SLO infeasible: best predicted {best:.0f} ms > budget {budget:.0f} ms",
            retry,
        )
