"""The one prefix estimate: the larger of the routed (approximate) and the precise match
per instance, scored once (two prefix scorers counted a prefix both knew twice).

A routed prompt is where its prefix will be from the pick on, but it is cached there only
once its carrier (the request that brings it) has finished its prefill: engines commit a
prompt's KV when its prefill ends, and the simulated engine admits the next waiting prompt
within that last step, before the blocks are committed. A turn that reaches the engine while
its predecessor still prefills therefore waits for that prefill and then computes the shared
prefix again; one held at the gateway (dispatch order) until the predecessor is done hits
it. With ``unfinished`` the estimate tells the cost plugins which part of it is still
unfinished (``ctx.unfinished_tokens``: priced as computed again). Counted as cached, a turn
that did compute it again was predicted at a few seconds and waited tens; not counted, one
that waited and hit is predicted too slow (benchmarks/README.md, "Routed prefixes still
being prefilled").
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence

from pydantic import Field

from services.common.routing.framework import CycleContext
from services.common.routing.plugins.prefix import (
    ApproxPrefix,
    ApproxPrefixParams,
    PrecisePrefix,
    PrecisePrefixParams,
    default_tier_weights,
    note_cached,
)
from services.common.routing.plugins.routed_index import RoutedPrefixIndex
from services.common.routing.registry import PluginEnv, register
from services.common.routing.types import EndpointView, Pick, RequestView, Tier


class PrefixEstimateParams(ApproxPrefixParams):
    tier_weights: dict[Tier, float] = Field(default_factory=default_tier_weights)
    # Tell cost plugins which part of a routed prefix is still being prefilled (False: all
    # of it counts as cached from the pick on, as sglang-router's approximate tree does; in
    # the simulator neither is better on every cell: benchmarks/README.md).
    unfinished: bool = False
    # Own picks waiting for their first byte that are remembered (the oldest are forgotten).
    max_unfinished: int = Field(65_536, gt=0)


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
    cost a pass over the candidates.

    With ``unfinished``, on instances where this gateway has picks that have not answered
    yet, the part of that estimate beyond both the engines' report and what answered picks
    routed there (a second index, filled when a pick settles as answered) is recorded as
    ``ctx.unfinished_tokens``: the score and placement keep counting it, the predicted TTFT
    does not. Another replica's picks (active-active) count as answered: their first bytes
    are not seen here."""

    def __init__(self, name: str, params: PrefixEstimateParams, env: PluginEnv) -> None:
        super().__init__(name, params, env)
        self.precise = PrecisePrefix(
            name, PrecisePrefixParams(tier_weights=params.tier_weights), env
        )
        self.track_unfinished = params.unfinished
        self.max_unfinished = params.max_unfinished
        # what answered picks routed where (own picks enter at their first byte)
        self.answered = RoutedPrefixIndex(params.ttl_s, params.max_entries, params.stride)
        # own picks not answered yet: request id -> (request, instances); count per instance
        self._unfinished: OrderedDict[str, tuple[RequestView, tuple[str, ...]]] = OrderedDict()
        self._unfinished_on: Counter[str] = Counter()
        self._now = float("-inf")  # the latest time seen: settles carry none

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        self._now = max(self._now, now)
        if self.track_unfinished and request.block_hashes:
            ids = _instances(pick)
            self._drop_unfinished(request.request_id)
            self._unfinished[request.request_id] = (request, ids)
            self._unfinished_on.update(ids)
            while len(self._unfinished) > self.max_unfinished:
                self._drop_unfinished(next(iter(self._unfinished)))
        super().on_pick(now, request, pick)  # the routed index: where the prefix will be

    def on_routed(self, now: float, request: RequestView, pick: Pick, undo: bool = True) -> None:
        super().on_routed(now, request, pick, undo)
        self._now = max(self._now, now)
        if self.track_unfinished and request.request_id not in self._unfinished:
            for i in _instances(pick):  # another replica's pick: counted as answered
                self.answered.insert(request.block_hashes, i, now)

    def _drop_unfinished(self, request_id: str) -> tuple[RequestView, tuple[str, ...]] | None:
        held = self._unfinished.pop(request_id, None)
        if held is not None:
            self._unfinished_on.subtract(held[1])
            for i in held[1]:
                if self._unfinished_on[i] <= 0:
                    del self._unfinished_on[i]
        return held

    def on_settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """Answered: the pick's prompt is cached on its instances from now (the latest time
        seen). Failed: it never was (the routed entries it created are dropped)."""
        super().on_settle(request, pick, ok)
        held = self._drop_unfinished(request.request_id)
        if held is not None and ok and held[0].block_hashes:
            for i in held[1]:
                self.answered.insert(held[0].block_hashes, i, self._now)

    def forget(self, instance_id: str) -> None:
        super().forget(instance_id)
        self.answered.remove_instance(instance_id)

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        self._now = max(self._now, ctx.now)
        routed = self._match(ctx, request) if request.block_hashes else {}
        known = self.precise.effective_blocks(request)
        if routed and self._unfinished_on:
            self._note_unfinished(ctx, request, routed, known)
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

    def _note_unfinished(
        self,
        ctx: CycleContext,
        request: RequestView,
        routed: Mapping[str, int],
        known: dict[str, float],
    ) -> None:
        """``ctx.unfinished_tokens`` on the instances with own picks not answered yet: the
        routed match beyond what answered picks routed there and the engines report."""
        on = self._unfinished_on
        pending = [i for i in routed if i in on]
        if not pending:
            return
        ready = self.answered.match(request.block_hashes, ctx.now)
        bs, out = request.block_size, ctx.unfinished_tokens
        for i in pending:
            done = max(ready.get(i, 0), known.get(i, 0.0))
            if routed[i] > done:
                out[i] = int(routed[i] * bs) - int(done * bs)

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


def _instances(pick: Pick) -> tuple[str, ...]:
    d = pick.decode.endpoint.instance_id
    return (d,) if pick.prefill is None else (d, pick.prefill.endpoint.instance_id)
