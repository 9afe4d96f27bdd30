"""sglang-router's ``cache_aware`` policy as one filter (a baseline for benchmarks).

sglang-router (0.3.x) decides in one of three ways, and this filter keeps exactly the
endpoint it would choose:

1. Imbalanced (the largest in-flight count exceeds the smallest by more than
   ``balance_abs_threshold`` AND is more than ``balance_rel_threshold`` times it): the
   least-loaded endpoint (shortest queue; the first of equals), whatever it caches.
2. Otherwise, when the best routed-prefix match is more than ``cache_threshold`` of the
   prompt: the endpoint with that match.
3. Otherwise: the endpoint whose routed history is smallest ("smallest tree": the router's
   approximate tree holds the text of every request routed to a worker, and a weak match
   goes to the worker with the least of it, not to the least-loaded one).

The routed-prefix match is the profile's ``approx-prefix`` preparer's estimate
(``CycleContext.cached_tokens``); the tree size is counted here, in blocks: a pick adds the
blocks of its prompt its instance did not already hold (what inserting the prompt adds to
the router's tree). The router's size-bounded eviction (2^26 characters per worker, every
60 s) is not modelled: runs of the benchmarks' length stay far below it. Loads are the
request counts the gateway sees (running + waiting + its own unreported dispatches), the
router's own in-flight counter's equivalent.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from services.scheduler.routing.framework import CycleContext
from services.scheduler.routing.registry import Params, PluginEnv, register
from services.scheduler.routing.types import EndpointView, Pick, RequestView

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
        self.tree_blocks: dict[str, int] = {}
        # the last cycle's request and its match per instance (tokens), for on_pick
        self._last: tuple[str, dict[str, int]] = ("", {})

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        self._last = (request.request_id, dict(ctx.cached_tokens))
        if len(candidates) < 2:
            return candidates
        return [self.choose(ctx, request, candidates)]

    def choose(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> EndpointView:
        loads = [e.queue_load for e in candidates]
        lo, hi = min(loads), max(loads)
        p = self.p
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            return candidates[loads.index(lo)]
        cached = ctx.cached_tokens
        best = max(candidates, key=lambda e: cached.get(e.instance_id, 0))
        matched = cached.get(best.instance_id, 0)
        if request.prompt_tokens > 0 and matched / request.prompt_tokens > p.cache_threshold:
            return best
        size = self.tree_blocks.get
        return min(candidates, key=lambda e: size(e.instance_id, 0))

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        rid, matched = self._last
        bs = max(1, request.block_size)
        for choice in (pick.decode, pick.prefill):
            if choice is None:
                continue
            iid = choice.endpoint.instance_id
            held = matched.get(iid, 0) // bs if rid == request.request_id else 0
            added = max(0, len(request.block_hashes) - held)
            self.tree_blocks[iid] = self.tree_blocks.get(iid, 0) + added
            if pick.prefill is None or pick.prefill is pick.decode:
                break

    def forget(self, instance_id: str) -> None:
        """Drop an instance's history (removed, or restarted with an empty cache)."""
        self.tree_blocks.pop(instance_id, None)
