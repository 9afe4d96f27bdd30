"""Prefix plugins: the approximate (routed-prefix) index and scorer, and the precise
(kvmeta-backed, tier-weighted) scorer."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from pydantic import Field

from services.scheduler.routing.framework import CycleContext
from services.scheduler.routing.registry import Params, PluginEnv, register
from services.scheduler.routing.types import EndpointView, Pick, RequestView, Tier


class RoutedPrefixIndex:
    """Which instances were recently sent which block-hash chains (pure, deterministic).

    Entries are (block hash, instance) with a last-routed time; an entry older than ``ttl_s``
    is ignored and dropped, and beyond ``max_entries`` the least recently routed entries are
    evicted. Because a chained hash covers its whole prefix, only every ``stride``-th block
    hash is indexed (positions stride-1, 2*stride-1, ...), trading granularity for memory.
    ``now`` must not go backwards across calls.
    """

    def __init__(self, ttl_s: float, max_entries: int, stride: int = 1) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.stride = stride
        self._lru: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._by_hash: dict[int, dict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def _drop(self, key: tuple[int, str]) -> None:
        del self._lru[key]
        holders = self._by_hash[key[0]]
        del holders[key[1]]
        if not holders:
            del self._by_hash[key[0]]

    def expire(self, now: float) -> int:
        """Drop entries older than the TTL; returns how many."""
        cutoff = now - self.ttl_s
        n = 0
        while self._lru:
            key, t = next(iter(self._lru.items()))
            if t >= cutoff:
                break
            self._drop(key)
            n += 1
        return n

    def insert(self, hashes: Sequence[int], instance_id: str, now: float) -> list[tuple[int, str]]:
        """Record that ``hashes`` (a chain, parent first) were routed to ``instance_id``.
        Returns the entries this call created (not those it only refreshed)."""
        self.expire(now)
        created: list[tuple[int, str]] = []
        for i in range(self.stride - 1, len(hashes), self.stride):
            key = (hashes[i], instance_id)
            if key in self._lru:
                self._lru.move_to_end(key)
            else:
                self._by_hash.setdefault(hashes[i], {})[instance_id] = None
                created.append(key)
            self._lru[key] = now
        while len(self._lru) > self.max_entries:
            self._drop(next(iter(self._lru)))
        return created

    def retract(self, keys: Sequence[tuple[int, str]], at: float) -> int:
        """Drop entries an insert at time ``at`` created, unless a later insert refreshed
        them (their time is no longer ``at``). Returns how many were dropped."""
        n = 0
        for key in keys:
            if self._lru.get(key) == at:
                self._drop(key)
                n += 1
        return n

    def match(self, hashes: Sequence[int], now: float) -> dict[str, int]:
        """Matched prefix length in blocks per instance (only instances with > 0)."""
        self.expire(now)
        out: dict[str, int] = {}
        alive: list[str] | None = None
        for i in range(self.stride - 1, len(hashes), self.stride):
            holders = self._by_hash.get(hashes[i])
            if not holders:
                break
            alive = list(holders) if alive is None else [x for x in alive if x in holders]
            if not alive:
                break
            for iid in alive:
                out[iid] = i + 1
        return out

    def remove_instance(self, instance_id: str) -> int:
        """Forget an instance (left the fleet or restarted with an empty cache)."""
        keys = [k for k in self._lru if k[1] == instance_id]
        for k in keys:
            self._drop(k)
        return len(keys)


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
        self._last: tuple[str, float, dict[str, int]] | None = None
        self._undo: OrderedDict[str, tuple[float, list[tuple[int, str]]]] = OrderedDict()
        self._undo_keys = 0

    def _match(self, ctx: CycleContext, request: RequestView) -> dict[str, int]:
        # One index lookup per cycle even when prepare and score both ask.
        if self._last and self._last[0] == request.request_id and self._last[1] == ctx.now:
            return self._last[2]
        m = self.index.match(request.block_hashes, ctx.now)
        self._last = (request.request_id, ctx.now, m)
        return m

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        m = self._match(ctx, request)
        for e in candidates:
            blocks = m.get(e.instance_id, 0)
            if blocks:
                ctx.note_cached(e.instance_id, blocks * request.block_size)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        total = len(request.block_hashes)
        if total == 0:
            return {}
        m = self._match(ctx, request)
        out: dict[str, float] = {}
        for e in candidates:
            ratio = m.get(e.instance_id, 0) / total
            out[e.instance_id] = ratio if ratio >= self.threshold else 0.0
        return out

    def forget(self, instance_id: str) -> None:
        """Drop an instance from the index (removed, or restarted with an empty cache)."""
        self._last = None
        self.index.remove_instance(instance_id)

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        self._last = None
        if not request.block_hashes:
            return
        created = self.index.insert(request.block_hashes, pick.decode.endpoint.instance_id, now)
        if pick.prefill is not None:
            created += self.index.insert(
                request.block_hashes, pick.prefill.endpoint.instance_id, now
            )
        self._forget_undo(request.request_id)
        if created:
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


def _default_tier_weights() -> dict[Tier, float]:
    return {"gpu": 1.0, "cpu": 0.8, "ssd": 0.5, "remote": 0.3}


class PrecisePrefixParams(Params):
    tier_weights: dict[Tier, float] = Field(default_factory=_default_tier_weights)


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

    def _effective_blocks(self, request: RequestView) -> dict[str, float]:
        out: dict[str, float] = {}
        for iid, m in (request.prefix_matches or {}).items():
            if m.tiers:
                eff = sum(self.tier_weights.get(t, 0.0) * n for t, n in m.tiers.items())
                out[iid] = min(eff, float(m.matched_blocks))
            else:
                out[iid] = m.matched_blocks * self.tier_weights.get("gpu", 1.0)
        return out

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        eff = self._effective_blocks(request)
        for e in candidates:
            if e.instance_id in eff:
                ctx.note_cached(e.instance_id, int(eff[e.instance_id] * request.block_size))

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        total = len(request.block_hashes)
        if total == 0:
            return {}
        eff = self._effective_blocks(request)
        return {e.instance_id: eff.get(e.instance_id, 0.0) / total for e in candidates}
