"""Prefix plugins: the approximate (routed-prefix) index and scorer, and the precise
(kvmeta-backed, tier-weighted) scorer."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence

from pydantic import Field

from services.scheduler.routing.framework import CycleContext
from services.scheduler.routing.registry import Params, PluginEnv, register
from services.scheduler.routing.types import EndpointView, Pick, PrefixMatch, RequestView, Tier


class _Rec:
    """One insert: its time, the instance slot and the indexed hashes (parent first).

    An entry (hash, slot) belongs to the record of the insert that last routed it
    (``table[hash] is rec``); older records keep stale references that are skipped."""

    __slots__ = ("cursor", "hashes", "slot", "t")

    def __init__(self, t: float, slot: int, hashes: tuple[int, ...]) -> None:
        self.t = t
        self.slot = slot
        self.hashes = hashes
        self.cursor = 0  # hashes before it were already evicted or expired


class RoutedPrefixIndex:
    """Which instances were recently sent which block-hash chains (pure, deterministic).

    Entries are (block hash, instance) with a last-routed time; an entry older than ``ttl_s``
    is ignored and dropped, and beyond ``max_entries`` the least recently routed entries are
    evicted (entries of one insert in chain order). Because a chained hash covers its whole
    prefix, only every ``stride``-th block hash is indexed (positions stride-1, 2*stride-1,
    ...), trading granularity for memory. ``now`` must not go backwards across calls.

    Layout: each instance owns a small-int slot; per block hash one int bitmask of the
    slots holding it (matching ANDs masks along the chain), and per slot a dict block hash
    → the insert record that last routed it. Records form a time-ordered log, so TTL
    expiry and LRU eviction pop from its head, skipping entries a later insert refreshed;
    the log is compacted when stale references outnumber live entries.
    """

    def __init__(self, ttl_s: float, max_entries: int, stride: int = 1) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.stride = stride
        self._masks: dict[int, int] = {}
        self._slot_of: dict[str, int] = {}
        self._iids: list[str] = []
        self._tables: list[dict[int, _Rec] | None] = []
        self._free: list[int] = []
        self._log: deque[_Rec] = deque()
        self._count = 0
        self._logged = 0  # hash references held by the log (live and stale)

    def __len__(self) -> int:
        return self._count

    # -- internals ------------------------------------------------------------------------
    def _slot(self, instance_id: str) -> int:
        slot = self._slot_of.get(instance_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
                self._iids[slot] = instance_id
                self._tables[slot] = {}
            else:
                slot = len(self._iids)
                self._iids.append(instance_id)
                self._tables.append({})
            self._slot_of[instance_id] = slot
        return slot

    def _release_slot(self, slot: int) -> None:
        del self._slot_of[self._iids[slot]]
        self._iids[slot] = ""
        self._tables[slot] = None
        self._free.append(slot)

    def _unmask(self, h: int, bit: int) -> None:
        m = self._masks[h] & ~bit
        if m:
            self._masks[h] = m
        else:
            del self._masks[h]

    def _pop_head(self, limit: int | None) -> None:
        """Drop the head record's live entries from its cursor on; stop early once
        ``limit`` entries were dropped (LRU eviction), else drop the whole record."""
        rec = self._log[0]
        table = self._tables[rec.slot]
        hashes = rec.hashes
        bit = 1 << rec.slot
        i, n, dropped = rec.cursor, len(hashes), 0
        while i < n and (limit is None or dropped < limit):
            h = hashes[i]
            i += 1
            if table is not None and table.get(h) is rec:
                del table[h]
                self._unmask(h, bit)
                dropped += 1
        self._count -= dropped
        self._logged -= i - rec.cursor
        rec.cursor = i
        if i >= n:
            self._log.popleft()
        if table is not None and not table:
            self._release_slot(rec.slot)

    def _compact(self) -> None:
        log: deque[_Rec] = deque()
        logged = 0
        for rec in self._log:
            table = self._tables[rec.slot]
            if table is None:
                continue
            keep = tuple(h for h in rec.hashes[rec.cursor :] if table.get(h) is rec)
            if keep:
                rec.hashes, rec.cursor = keep, 0
                log.append(rec)
                logged += len(keep)
        self._log, self._logged = log, logged

    # -- API ------------------------------------------------------------------------------
    def expire(self, now: float) -> int:
        """Drop entries older than the TTL; returns how many."""
        cutoff = now - self.ttl_s
        before = self._count
        log = self._log
        while log and log[0].t < cutoff:
            self._pop_head(None)
        return before - self._count

    def insert(self, hashes: Sequence[int], instance_id: str, now: float) -> list[tuple[int, str]]:
        """Record that ``hashes`` (a chain, parent first) were routed to ``instance_id``.
        Returns the entries this call created (not those it only refreshed)."""
        self.expire(now)
        hs = tuple(hashes[self.stride - 1 :: self.stride] if self.stride > 1 else hashes)
        if not hs:
            return []
        slot = self._slot(instance_id)
        table = self._tables[slot]
        assert table is not None
        bit = 1 << slot
        rec = _Rec(now, slot, hs)
        masks = self._masks
        created: list[tuple[int, str]] = []
        for h in hs:
            if table.get(h) is None:
                masks[h] = masks.get(h, 0) | bit
                created.append((h, instance_id))
            table[h] = rec
        self._log.append(rec)
        self._count += len(created)
        self._logged += len(hs)
        while self._count > self.max_entries:
            self._pop_head(self._count - self.max_entries)
        if self._logged > 3 * self._count + 65_536:
            self._compact()
        return created

    def retract(self, keys: Sequence[tuple[int, str]], at: float) -> int:
        """Drop entries an insert at time ``at`` created, unless a later insert refreshed
        them (their time is no longer ``at``). Returns how many were dropped."""
        n = 0
        for h, iid in keys:
            slot = self._slot_of.get(iid)
            if slot is None:
                continue
            table = self._tables[slot]
            rec = table.get(h) if table is not None else None
            if table is not None and rec is not None and rec.t == at:
                del table[h]
                self._unmask(h, 1 << slot)
                n += 1
                if not table:
                    self._release_slot(slot)
        self._count -= n
        return n

    def match(self, hashes: Sequence[int], now: float) -> dict[str, int]:
        """Matched prefix length in blocks per instance (only instances with > 0)."""
        self.expire(now)
        stride = self.stride
        hs = hashes[stride - 1 :: stride] if stride > 1 else hashes
        if not hs:
            return {}
        get = self._masks.get
        alive = get(hs[0], 0)
        if not alive:
            return {}
        lengths: dict[int, int] = {}
        length = stride
        for k in range(1, len(hs)):
            m = get(hs[k], 0) & alive
            if m != alive:
                _record(alive ^ m, length, lengths)
                alive = m
                if not alive:
                    break
            length += stride
        _record(alive, length, lengths)
        iids = self._iids
        return {iids[slot]: n for slot, n in lengths.items()}

    def remove_instance(self, instance_id: str) -> int:
        """Forget an instance (left the fleet or restarted with an empty cache)."""
        slot = self._slot_of.get(instance_id)
        if slot is None:
            return 0
        table = self._tables[slot]
        n = len(table) if table is not None else 0
        bit = 1 << slot
        for h in table or ():
            self._unmask(h, bit)
        self._count -= n
        self._release_slot(slot)
        return n


def _record(slots: int, length: int, lengths: dict[int, int]) -> None:
    while slots:
        low = slots & -slots
        lengths[low.bit_length() - 1] = length
        slots ^= low


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
        if m:
            _note_cached(ctx, m, candidates, request.block_size)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        if not request.block_hashes:
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
        # (the request's prefix_matches object, its effective blocks per instance)
        self._last: tuple[Mapping[str, PrefixMatch], dict[str, float]] | None = None

    def _effective_blocks(self, request: RequestView) -> dict[str, float]:
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
        for iid, m in found.items():
            tiers = m.tiers
            if not tiers:
                out[iid] = m.matched_blocks * gpu
            elif len(tiers) == 1:
                ((t, n),) = tiers.items()
                out[iid] = min(w.get(t, 0.0) * n, float(m.matched_blocks))
            else:
                eff = sum(w.get(t, 0.0) * n for t, n in tiers.items())
                out[iid] = min(eff, float(m.matched_blocks))
        self._last = (found, out)
        return out

    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        eff = self._effective_blocks(request)
        if eff:
            _note_cached(ctx, eff, candidates, request.block_size)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        if not request.block_hashes:
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
        total = len(request.block_hashes)
        eff = self._effective_blocks(request) if total else None
        if not eff:
            return [0.0] * len(candidates)
        get = eff.get
        return [get(e.instance_id, 0.0) / total for e in candidates]


def _note_cached(
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
