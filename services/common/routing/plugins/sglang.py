"""sglang-router's ``cache_aware`` policy as one filter (a baseline for benchmarks).

sglang-router 0.3.2 (the model gateway) decides in one of three ways, and this filter keeps
exactly the endpoint it would choose:

1. Imbalanced (the largest in-flight count exceeds the smallest by more than
   ``balance_abs_threshold`` AND is more than ``balance_rel_threshold`` times it): the
   least-loaded endpoint (shortest queue; the first of equals), whatever it caches.
2. Otherwise, when the best routed-prefix match is more than ``cache_threshold`` of the
   prompt: the endpoint with that match, however loaded.
3. Otherwise (a weak match): the least-loaded endpoint.

The routed-prefix match is the profile's ``approx-prefix`` preparer's estimate
(``CycleContext.cached_tokens``: the router's approximate tree is the text of the requests
it routed, per worker). Loads are the request counts the gateway sees (running + waiting +
its own dispatches not yet reported), the equivalent of the router's in-flight counters.
The router's size-bounded tree eviction (2^26 characters per worker) is not modelled: runs
of the benchmarks' length stay below it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from services.common.routing.framework import CycleContext
from services.common.routing.registry import Params, PluginEnv, register
from services.common.routing.types import EndpointView, RequestView

__all__ = ["SglangCacheAware", "SglangCacheAwareParams"]


class SglangCacheAwareParams(Params):
    # sglang-router 0.3.2's defaults (router_args.py)
    cache_threshold: float = Field(0.3, ge=0, le=1)
    balance_abs_threshold: int = Field(64, ge=0)
    balance_rel_threshold: float = Field(1.5, ge=1.0)


@register("sglang-cache-aware", SglangCacheAwareParams)
class SglangCacheAware:
    """Keep the one endpoint sglang-router's ``cache_aware`` would choose (module doc)."""

    def __init__(self, name: str, params: SglangCacheAwareParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        if len(candidates) < 2:
            return candidates
        return [self.choose(ctx, request, candidates)]

    def choose(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> EndpointView:
        loads = [e.queue_load for e in candidates]
        lo, hi = min(loads), max(loads)
        least = candidates[loads.index(lo)]
        p = self.p
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            return least
        cached = ctx.cached_tokens
        best = max(candidates, key=lambda e: cached.get(e.instance_id, 0))
        matched = cached.get(best.instance_id, 0)
        if request.prompt_tokens > 0 and matched / request.prompt_tokens > p.cache_threshold:
            return best
        return least
