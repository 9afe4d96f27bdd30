"""The one prefix estimate: the larger of the routed (approximate) and the precise match
per instance, scored once (two prefix scorers counted a prefix both knew twice)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from services.scheduler.routing.framework import CycleContext
from services.scheduler.routing.plugins.prefix import (
    ApproxPrefix,
    ApproxPrefixParams,
    PrecisePrefix,
    PrecisePrefixParams,
    default_tier_weights,
    note_cached,
)
from services.scheduler.routing.registry import PluginEnv, register
from services.scheduler.routing.types import EndpointView, RequestView, Tier


class PrefixEstimateParams(ApproxPrefixParams):
    tier_weights: dict[Tier, float] = Field(default_factory=default_tier_weights)


@register("prefix-estimate", PrefixEstimateParams)
class PrefixEstimate(ApproxPrefix):
    """ONE prefix estimate from both signals, and one score: per candidate the larger of

    * the routed (approximate) match: what this gateway sent there recently, including
      requests still in flight that no engine has reported yet (:class:`ApproxPrefix`), and
    * the precise match: what the engines report holding (kvmeta ``MatchPrefix`` or the
      local KV replica, tier-weighted as :class:`PrecisePrefix` does),

    recorded as the cycle's cached-token estimate; score = that estimate / prompt tokens
    (below ``threshold``: 0). Two scorers over the same prefix counted it twice (an instance
    known to both ranked above one known to either by the same amount of cache), and each
    cost a pass over the candidates."""

    def __init__(self, name: str, params: PrefixEstimateParams, env: PluginEnv) -> None:
        super().__init__(name, params, env)
        self.precise = PrecisePrefix(
            name, PrecisePrefixParams(tier_weights=params.tier_weights), env
        )

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        routed = self._match(ctx, request) if request.block_hashes else {}
        known = self.precise.effective_blocks(request)
        if not known:
            if routed:
                note_cached(ctx, routed, candidates, request.block_size)
            return
        if not routed:
            note_cached(ctx, known, candidates, request.block_size)
            return
        # Both: the larger per candidate, in one pass.
        cached, bs = ctx.cached_tokens, request.block_size
        r_get, k_get = routed.get, known.get
        for e in candidates:
            iid = e.instance_id
            a, b = r_get(iid, 0), k_get(iid, 0.0)
            best = a if a >= b else b
            if best:
                tokens = int(best * bs)
                if tokens > cached.get(iid, 0):
                    cached[iid] = tokens

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        """:meth:`score` aligned with ``candidates``: the cycle's cached-token estimate
        (the larger of the two signals; read after every preparer ran) / prompt tokens."""
        n = request.prompt_tokens
        cached = ctx.cached_tokens
        if n <= 0 or not cached or not request.block_hashes:
            return [0.0] * len(candidates)
        get, thr = cached.get, self.threshold
        out = [min(get(e.instance_id, 0) / n, 1.0) for e in candidates]
        return [r if r >= thr else 0.0 for r in out] if thr > 0 else out
