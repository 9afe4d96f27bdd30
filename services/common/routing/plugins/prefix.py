"""Prefix plugins: the approximate (routed-prefix) index and scorer, and the precise
(kvmeta-backed, tier-weighted) scorer."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from pydantic import Field

from services.common.routing.framework import CycleContext, by_instance
from services.common.routing.plugins.routed_index import RoutedPrefixIndex
from services.common.routing.registry import Params, PluginEnv, register
from services.common.routing.types import EndpointView, Pick, PrefixMatch, RequestView, Tier


class ApproxPrefixParams(Params):
    ttl_s: float = Field(600.0, gt=0)
    max_entries: int = Field(2_000_000, gt=0)
    stride: int = Field(1, ge=1)
    # Match ratios below this score 0 (like sglang-router's cache_threshold).
    threshold: float = Field(0.0, ge=0, le=1)


@register("approx-prefix", ApproxPrefixParams)
class ApproxPrefix:
    """Score = (blocks of the prompt's prefix routed to the instance recently) / (prompt
    blocks), from a gateway-side index updated after every pick (prefill and decode
    instances). Also records the estimate as cached tokens for later plugins.

    Entries are written at pick time, so that a burst of requests sharing a prefix follows
    the first one before it has answered. A pick that then fails before its first byte is
    settled as not ok (:meth:`on_settle`): the entries it *created* are dropped again
    (entries that existed before it stay: they record earlier routing that did reach the
    instance). Keeping them would steer the session's next turns to an instance that most
    likely holds nothing (connection refused, 5xx, or a dead engine whose cache is gone),
    away from the retry target that does; a prefill cut short may have cached part of the
    prompt, but kvmeta's precise index sees that from the engine's own KV events."""

    phase = 0
    # Undo records (entries created per request) kept for at most this many index keys.
    undo_max_keys = 262_144

    def __init__(self, name: str, params: ApproxPrefixParams, env: PluginEnv) -> None:
        self.name = name
        self.threshold = params.threshold
        self.index = RoutedPrefixIndex(params.ttl_s, params.max_entries, params.stride)
        self._last: tuple[str, float, Mapping[str, int]] | None = None
        self._undo: OrderedDict[str, tuple[float, list[tuple[int, str]]]] = OrderedDict()
        self._undo_keys = 0

    def _match(self, ctx: CycleContext, request: RequestView) -> Mapping[str, int]:
        return self.lookup(request.request_id, request.block_hashes, ctx.now)

    def lookup(self, request_id: str, hashes: Sequence[int], now: float) -> Mapping[str, int]:
        """The index's match of ``request_id``'s chain ``hashes`` at ``now``, looked up once
        per cycle even when prepare and score both ask (and when a caller asked just before
        the cycle, as the simulator's routing diagnostics do). Do not modify the result."""
        last = self._last
        if last and last[0] == request_id and last[1] == now:
            return last[2]
        m = self.index.match(hashes, now)
        self._last = (request_id, now, m)
        return m

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        m = self._match(ctx, request)
        if m:
            note_cached(ctx, m, candidates, request.block_size)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        if not request.block_hashes:
            return {}
        return by_instance(candidates, self.score_list(ctx, request, candidates))

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        """:meth:`score` aligned with ``candidates``."""
        total = len(request.block_hashes)
        m = self._match(ctx, request) if total else None
        if not m:
            return [0.0] * len(candidates)
        get, thr = m.get, self.threshold
        out = [get(e.instance_id, 0) / total for e in candidates]
        return [r if r >= thr else 0.0 for r in out] if thr > 0 else out

    def forget(self, instance_id: str) -> None:
        """Drop an instance from the index (removed, or restarted with an empty cache)."""
        self._last = None
        self.index.remove_instance(instance_id)

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        self.on_routed(now, request, pick)

    def on_routed(self, now: float, request: RequestView, pick: Pick, undo: bool = True) -> None:
        """Index ``request``'s chain on the pick's instances at ``now``; with ``undo`` the
        entries it created are dropped again if the pick then fails (:meth:`on_settle`)."""
        self._last = None
        if not request.block_hashes:
            return
        created = self.index.insert(request.block_hashes, pick.decode.endpoint.instance_id, now)
        if pick.prefill is not None:
            created += self.index.insert(
                request.block_hashes, pick.prefill.endpoint.instance_id, now
            )
        self._forget_undo(request.request_id)
        if created and undo:
            self._undo[request.request_id] = (now, created)
            self._undo_keys += len(created)
            while self._undo_keys > self.undo_max_keys and self._undo:
                self._undo_keys -= len(self._undo.popitem(last=False)[1][1])

    def _forget_undo(self, request_id: str) -> tuple[float, list[tuple[int, str]]] | None:
        rec = self._undo.pop(request_id, None)
        if rec is not None:
            self._undo_keys -= len(rec[1])
        return rec

    def on_settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """The pick reached its instance (``ok``) or failed before its first byte: then
        drop the entries it created. Unknown or already settled requests are ignored."""
        rec = self._forget_undo(request.request_id)
        if rec is not None and not ok:
            self._last = None
            self.index.retract(rec[1], rec[0])


def default_tier_weights() -> dict[Tier, float]:
    return {"gpu": 1.0, "cpu": 0.8, "ssd": 0.5, "remote": 0.3}


class PrecisePrefixParams(Params):
    tier_weights: dict[Tier, float] = Field(default_factory=default_tier_weights)


@register("precise-prefix", PrecisePrefixParams)
class PrecisePrefix:
    """Score = tier-weighted matched blocks / prompt blocks, from kvmeta's MatchPrefix
    answer carried in ``request.prefix_matches`` (looked up by the shell before the
    cycle). Tiers missing from ``tier_weights`` weigh 0; a match without a tier breakdown
    counts as GPU. Without a lookup (None) every endpoint scores 0."""

    phase = 0

    def __init__(self, name: str, params: PrecisePrefixParams, env: PluginEnv) -> None:
        self.name = name
        for tier, w in params.tier_weights.items():
            if not 0.0 <= w <= 1.0:
                raise ValueError(f"tier weight for {tier!r} must be in [0, 1], got {w}")
        self.tier_weights = dict(params.tier_weights)
        # (the request's prefix_matches object, its effective blocks per instance)
        self._last: tuple[Mapping[str, PrefixMatch], dict[str, float]] | None = None

    def effective_blocks(self, request: RequestView) -> dict[str, float]:
        """Tier-weighted matched blocks per instance from ``request.prefix_matches``."""
        found = request.prefix_matches
        if not found:
            return {}
        # One conversion per request even when prepare and score both ask.
        last = self._last
        if last is not None and last[0] is found:
            return last[1]
        out: dict[str, float] = {}
        w = self.tier_weights
        gpu = w.get("gpu", 1.0)
        # Lookups share one PrefixMatch among instances with equal matches: convert each once.
        seen: dict[int, float] = {}
        for iid, m in found.items():
            eff = seen.get(id(m))
            if eff is None:
                tiers = m.tiers
                if not tiers:
                    eff = m.matched_blocks * gpu
                elif len(tiers) == 1:
                    ((t, n),) = tiers.items()
                    eff = min(w.get(t, 0.0) * n, float(m.matched_blocks))
                else:
                    eff = sum(w.get(t, 0.0) * n for t, n in tiers.items())
                    eff = min(eff, float(m.matched_blocks))
                seen[id(m)] = eff
            out[iid] = eff
        self._last = (found, out)
        return out

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        eff = self.effective_blocks(request)
        if eff:
            note_cached(ctx, eff, candidates, request.block_size)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        if not request.block_hashes:
            return {}
        return by_instance(candidates, self.score_list(ctx, request, candidates))

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        """:meth:`score` aligned with ``candidates``."""
        total = len(request.block_hashes)
        eff = self.effective_blocks(request) if total else None
        if not eff:
            return [0.0] * len(candidates)
        get = eff.get
        return [get(e.instance_id, 0.0) / total for e in candidates]


def note_cached(
    ctx: CycleContext,
    blocks: Mapping[str, float] | Mapping[str, int],
    candidates: Sequence[EndpointView],
    block_size: int,
) -> None:
    """``ctx.note_cached`` for every candidate with matched blocks (tokens truncated)."""
    cached = ctx.cached_tokens
    get = blocks.get
    for e in candidates:
        b = get(e.instance_id)
        if b:
            iid = e.instance_id
            tokens = int(b * block_size)
            if tokens > cached.get(iid, 0):
                cached[iid] = tokens
