"""The pre-filter by score bounds: only the candidates that can win a cycle, and those the
cycle's normalisations are taken from (:class:`BoundFilter`, used by
:class:`~services.sim.narrow.NarrowScheduler`).

At a thousand instances nearly every one holds a prefix of the next prompt (a common
system prompt is routed everywhere), so grouping equal candidates (``narrow.py``) keeps most
of them. For a profile made only of a load guard, one prefix estimate, one ttft-cost and one
least-load scorer (and scorers that score nothing for the request: session-home without a
session, session-load below its prompt threshold; the decode-room filter, which keeps every
candidate of a fleet without decode-role endpoints), this filter computes every candidate's
total the way those plugins do, as numpy arrays over the fleet (kept up to date from the few
views that change between cycles), and hands the real scheduler only

* the candidates whose total is within ``MARGIN`` of the best (the pick is among them: the
  arrays' totals differ from the plugins' by float rounding, far below ``MARGIN``), less any
  whose every input equals an earlier kept one's (equal inputs give bit-equal totals, and
  the picker takes the first best in order), and
* the candidates every cross-candidate quantity is taken from: the guard's least load, the
  cheapest own prefill (ttft-cost's recompute term), the least cost among the guard's
  survivors (ttft-cost's normalisation) and each least-load metric's maximum among them.

Every kept candidate therefore gets the same scores as among all candidates, bit for bit,
and the first best among them is the first best among all. Any other profile, a request
with a session, or a fleet with prefill or ineligible endpoints: ``plan`` is None and the
grouping pre-filter applies. ``tests/unit/test_sim_bound.py`` and
``tests/unit/test_sim_narrow.py`` compare the decisions with and without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count
from operator import is_not
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common.routing.framework import MaxScorePicker, Profile
from services.common.routing.plugins.affinity import SessionHome
from services.common.routing.plugins.cost import TTFTCost
from services.common.routing.plugins.estimate import PrefixEstimate
from services.common.routing.plugins.load import LeastLoad, LoadGuard
from services.common.routing.plugins.pending import PendingPicks
from services.common.routing.plugins.placement import SessionLoad
from services.common.routing.plugins.room import DecodeRoom
from services.common.routing.plugins.routed_match import RoutedMatch
from services.common.routing.types import EndpointSnapshot, EndpointView, RequestView
from services.sim.routed_cols import RoutedColumns

__all__ = ["MARGIN", "BoundFilter", "BoundPlan", "bound_plan"]

MARGIN = 1e-9
"""Candidates within this of the best total are kept (totals are at most a few tens; the
arrays' and the plugins' float sums differ by ~1e-14)."""

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.intp]
# weights of the inputs' sum that groups equal candidates (fixed: a run's groups must not
# depend on anything but its inputs; a sum shared by unequal ones is caught and undone)
_MIX: F64 = np.random.default_rng(0).uniform(1.0, 2.0, 32)
# the view fields a plugin of the plan reads (rows of _Fleet.cols)
_RUN, _WAIT, _TIF, _PEND, _KV, _TPS, _RREQ, _RTOK = range(8)
_NROW = 8


def _row(e: EndpointView) -> tuple[float, ...]:
    return (
        e.running, e.waiting, e.tokens_in_flight, e.pending_prefill_tokens, e.kv_usage,
        e.prefill_tokens_per_s, e.reserved_requests, e.reserved_tokens,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class BoundPlan:
    """A profile the filter understands: its plugins and each scorer type's total weight."""

    guard: LoadGuard | None
    prefix: PrefixEstimate | None
    ttft: TTFTCost | None
    load: LeastLoad | None
    w_prefix: float
    w_ttft: float
    w_load: float
    session_load: SessionLoad | None
    w_session_load: float


def _one(objs: list[Any]) -> Any:
    distinct = {id(o): o for o in objs}
    return next(iter(distinct.values())) if len(distinct) == 1 else None


def bound_plan(prof: Profile) -> BoundPlan | None:
    """The plan of ``prof``, None when the filter does not apply to it."""
    picker = prof.picker
    if type(picker) is not MaxScorePicker or picker.random_ties:
        return None
    kinds = (PrefixEstimate, TTFTCost, LeastLoad, SessionHome, SessionLoad)
    if any(type(s) not in kinds for s, _ in prof.scorers):
        return None
    # decode-room keeps every candidate here (the pre-filter runs only over a fleet without
    # decode-role endpoints)
    guards = [f for f in prof.filters if type(f) is not DecodeRoom]
    if len(guards) > 1 or any(type(f) is not LoadGuard for f in guards):
        return None
    by: dict[type, list[Any]] = {k: [s for s, _ in prof.scorers if type(s) is k] for k in kinds}
    prefix, ttft, load = (_one(by[k]) for k in (PrefixEstimate, TTFTCost, LeastLoad))
    session_load = _one(by[SessionLoad])
    for k, one in (
        (PrefixEstimate, prefix), (TTFTCost, ttft), (LeastLoad, load), (SessionLoad, session_load)
    ):  # fmt: skip
        if by[k] and one is None:
            return None  # two plugins of a type: not handled
    if any(p is not prefix and p is not ttft for p in prof.preparers):
        return None
    if prefix is not None and (prefix not in prof.preparers or prefix.track_unfinished):
        return None
    if ttft is not None and (ttft not in prof.preparers or ttft.p.kv_pressure > 0):
        return None
    weight = {k: sum(w for s, w in prof.scorers if type(s) is k) for k in kinds}
    return BoundPlan(
        guards[0] if guards else None,  # type: ignore[arg-type]
        prefix, ttft, load,
        weight[PrefixEstimate], weight[TTFTCost], weight[LeastLoad],
        session_load, weight[SessionLoad],
    )  # fmt: skip


def changed_positions(
    old: tuple[EndpointView, ...], new: tuple[EndpointView, ...]
) -> list[int] | None:
    """The positions whose view object changed from ``old`` to ``new`` (the snapshot
    replaces a view when it changes), or None when they are not the same endpoints in the
    same order."""
    if len(new) != len(old):
        return None
    changed = list(compress(count(), map(is_not, old, new)))
    for i in changed:
        if new[i].instance_id != old[i].instance_id:
            return None
    return changed


class _Fleet:
    """A snapshot's view fields as columns (one row per field), followed from one snapshot
    to the next by the views that changed; with the sums the plugins take of them
    (``sums``) and ttft-cost's queue wait per throughput setting (``wait``), kept up to date
    the same way (the same float operations in the same order: the same values)."""

    def __init__(self, snapshot: EndpointSnapshot) -> None:
        self.snap = snapshot  # held: a snapshot patched from it names it by id
        self.items = tuple(snapshot)
        self.pos = {e.instance_id: i for i, e in enumerate(self.items)}
        # the view fields' rows, then the sums' rows (one column per view): one matrix, so a
        # changed view is one assignment and least-load's metrics one selection
        cols = np.array([_row(e) for e in self.items], dtype=np.float64).T
        self.m: F64 = np.concatenate([cols, np.array(_sums(cols))])
        self.cols: F64 = self.m[:_NROW]
        self.sums: F64 = self.m[_NROW:]
        # (model tokens/s, whether an engine's own rate counts) -> (throughput, wait) columns
        self._waits: dict[tuple[float, bool], tuple[F64, F64]] = {}
        self._pending: tuple[PendingPicks, set[str], F64] | None = None
        self._session: tuple[SessionLoad, set[str], F64, F64, npt.NDArray[np.bool_]] | None = None
        self.routed = RoutedColumns(self.pos, len(self.items))

    def update(self, snapshot: EndpointSnapshot) -> bool:
        """Follow ``snapshot``; False when its endpoints are not the same ones (rebuild)."""
        if snapshot is self.snap:
            return True
        new = tuple(snapshot)
        patched = snapshot.patched
        changed: Sequence[int] | None
        if patched is not None and patched[0] == id(self.snap):
            changed = patched[1]  # the snapshot patched from the last one followed
        else:
            changed = changed_positions(self.items, new)
            if changed is None:
                return False
        self.snap = snapshot
        m, waits = self.m, self._waits
        for i in changed:
            r = _row(new[i])
            m[:, i] = r + _sums(r)
            for (model_tps, engine), (tput, wait) in waits.items():
                tput[i], wait[i] = _wait(r, model_tps, engine)
        self.items = new
        return True

    def wait(self, model_tps: float, engine: bool) -> tuple[F64, F64]:
        """ttft-cost's throughput and queue wait (ms) per candidate, as its prepare computes
        them: ``1000 * pending / throughput`` where both are positive, else 0."""
        key = (model_tps, engine)
        hit = self._waits.get(key)
        if hit is None:
            pend = self.sums[_S_PEND]
            tput = np.full(len(self.items), model_tps)
            if engine:
                tput = np.maximum(tput, self.cols[_TPS])
            ok = (pend > 0) & (tput > 0)
            wait = np.zeros(len(self.items))
            wait[ok] = 1000.0 * pend[ok] / tput[ok]
            if len(self._waits) >= 4:  # a fitted model's rate moves: keep the latest few
                self._waits.clear()
            hit = self._waits[key] = (tput, wait)
        return hit

    def pending(self, picks: PendingPicks) -> F64:
        """``picks.totals`` as a column (:meth:`spread`), kept up to date from the instances
        ``picks`` marks as touched; rebuilt when another follower took its marks over."""
        hit = self._pending
        if hit is not None and hit[0] is picks and picks.touched is hit[1]:
            col, touched = hit[2], hit[1]
            if touched:
                pos, totals = self.pos, picks.totals
                for iid in touched:
                    i = pos.get(iid)
                    if i is not None:
                        col[i] = totals[iid]
                touched.clear()
            return col
        touched = picks.touched = set()
        col = self.spread(picks.totals)
        self._pending = (picks, touched, col)
        return col

    def committed(self, sl: SessionLoad, now: float) -> tuple[F64, F64]:
        """session-load's commitments as columns: the decayed tokens (0 where none) and
        their time (``now`` where none), kept up to date from the instances ``sl`` marks as
        touched; rebuilt when another follower took its marks over."""
        hit = self._session
        if hit is not None and hit[0] is sl and sl.touched is hit[1]:
            _, touched, v, t, has = hit
            if touched:
                pos, held = self.pos, sl._committed
                for iid in touched:
                    i = pos.get(iid)
                    if i is not None:
                        v[i], t[i] = held[iid]
                        has[i] = True
                touched.clear()
        else:
            touched = sl.touched = set()
            held = sl._committed
            n, k = len(self.items), len(held)
            v, t, has = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
            if k:
                vt = np.array(list(held.values()), dtype=np.float64)
                at = np.fromiter(map(self.pos.get, held, [-1] * k), np.intp, k)
                ok = at >= 0
                v[at[ok]], t[at[ok]], has[at[ok]] = vt[ok, 0], vt[ok, 1], True
            self._session = (sl, touched, v, t, has)
        return v, np.where(has, t, now)

    def spread(self, values: Mapping[str, Any], default: float = 0.0) -> F64:
        """``values`` per instance id as a column (ids not in the fleet ignored)."""
        out = np.full(len(self.items), default)
        if values:
            n = len(values)
            try:
                at = np.fromiter(map(self.pos.__getitem__, values), np.intp, n)
            except KeyError:
                at = np.fromiter(map(self.pos.get, values, [-1] * n), np.intp, n)
                v = np.fromiter(values.values(), np.float64, n)
                ok = at >= 0
                out[at[ok]] = v[ok]
                return out
            out[at] = np.fromiter(values.values(), np.float64, n)
        return out


# rows of _Fleet.sums
_S_TOK, _S_REQ, _S_PEND, _S_WAITING, _S_DEC = range(5)
# least-load's metrics (waiting, running, tokens, KV usage) as rows of _Fleet.m
_LOAD_ROWS = [_NROW + _S_WAITING, _RUN, _NROW + _S_TOK, _KV]


def _sums(r: Any) -> tuple[Any, ...]:
    """The rows of ``_Fleet.sums`` from the columns' rows (``r``: ``_Fleet.cols``), or one
    view's column of them from its row (``r``: ``_row``'s tuple): the same additions in the
    same order, so the same values."""
    return (
        r[_TIF] + r[_RTOK], r[_RUN] + r[_WAIT] + r[_RREQ], r[_PEND] + r[_RTOK],
        r[_WAIT] + r[_RREQ], r[_RUN] + r[_RREQ],
    )  # fmt: skip


def _wait(r: tuple[float, ...], model_tps: float, engine: bool) -> tuple[float, float]:
    """One view's (throughput, wait) of :meth:`_Fleet.wait`."""
    pend = r[_PEND] + r[_RTOK]
    tput = max(model_tps, r[_TPS]) if engine else model_tps
    return tput, (1000.0 * pend / tput if pend > 0 and tput > 0 else 0.0)


def _first_min(x: F64, mask: npt.NDArray[np.bool_]) -> int:
    """The first position of ``x``'s least value where ``mask`` (not empty, no NaN)."""
    at = int(np.argmin(np.where(mask, x, np.inf)))
    if not mask[at]:  # every masked value is inf
        at = int(np.flatnonzero(mask)[np.argmin(x[mask])])
    return at


def _near(first: int, near: npt.NDArray[np.bool_], inputs: list[F64]) -> list[int]:
    """``first`` (a value's first extreme) and those ``near`` it from other ``inputs`` (equal
    inputs give the plugin bit-equal values, so those stay tied behind ``first``)."""
    if np.count_nonzero(near) <= 1:  # ``first`` alone (the usual case)
        return [first]
    differ = np.zeros(len(near), dtype=bool)
    for col in inputs:
        differ |= col != col[first]
    return [first, *np.flatnonzero(near & differ).tolist()]


def _first_max(x: F64, mask: npt.NDArray[np.bool_]) -> int:
    """The first position of ``x``'s greatest value where ``mask`` (not empty, no NaN)."""
    at = int(np.argmax(np.where(mask, x, -np.inf)))
    if not mask[at]:  # every masked value is -inf
        at = int(np.flatnonzero(mask)[np.argmax(x[mask])])
    return at


class BoundFilter:
    """The positions (in snapshot order) a cycle of a :class:`BoundPlan` profile needs."""

    def __init__(self) -> None:
        self._fleet: _Fleet | None = None

    def _follow(self, snapshot: EndpointSnapshot) -> _Fleet:
        f = self._fleet
        if f is None or not f.update(snapshot):
            f = self._fleet = _Fleet(snapshot)
        return f

    def kept(
        self, plan: BoundPlan, request: RequestView, snapshot: EndpointSnapshot, now: float
    ) -> list[int]:
        """Ascending positions: the candidates that can be picked, and the anchors."""
        f = self._follow(snapshot)
        cached, blocks = _cached(plan, f, request, now)
        tc = plan.ttft
        k = f.pending(tc._awaiting) if tc is not None and tc.p.interference > 0 else None
        anchors: list[int] = []
        extra = [cached] if k is None else [cached, k]  # per-request inputs besides the views
        surv = _survivors(plan.guard, f, cached, anchors)
        total: F64 | float = 0.0  # a column from the first term on
        if tc is not None:
            inputs: list[F64] = []
            cost = _costs(tc, f, request, (cached, blocks), k, anchors, inputs)
            eps = cost + tc.p.epsilon_ms
            at = _first_min(eps, surv)
            lo = eps[at]
            # the cheapest: ttft-cost's normalisation (and, in case rounding differs, any
            # within MARGIN of it from other inputs)
            anchors += _near(at, surv & (eps <= lo + MARGIN * (1.0 + lo)), inputs)
            total = total + plan.w_ttft * (lo / eps)
        if plan.prefix is not None and plan.w_prefix:
            total = total + plan.w_prefix * _prefix_scores(plan.prefix, request, cached)
        if plan.load is not None:
            total = total + plan.w_load * _load_scores(plan.load, f, surv, anchors)
        if plan.session_load is not None and plan.w_session_load:
            sl = _session_load_scores(plan.session_load, request, now, f, surv, anchors, extra)
            if sl is not None:
                total = total + plan.w_session_load * sl
        if isinstance(total, float):
            total = np.full(len(f.items), total)
        best = total[surv].max()
        sel = surv & (total >= best - MARGIN)
        sel[anchors] = True
        return _first_of_equals(sel, f.cols, extra)


def _cached(plan: BoundPlan, f: _Fleet, request: RequestView, now: float) -> tuple[F64, I64 | None]:
    """The prefix estimate's cached tokens per candidate (what its prepare records), and
    the whole blocks they are when they are read from the routed match alone (else None)."""
    pe = plan.prefix
    if pe is None:
        return np.zeros(len(f.items)), None
    routed = (
        pe.lookup(request.request_id, request.block_hashes, now) if request.block_hashes else {}
    )
    is_match = isinstance(routed, RoutedMatch)
    blocks = f.routed.column(routed) if isinstance(routed, RoutedMatch) else f.spread(routed)
    known = pe.precise.effective_blocks(request)
    if known:
        blocks = np.maximum(blocks, f.spread(known))
    elif is_match and request.block_size > 0:
        # whole match lengths: floor(blocks * block_size) is the product itself
        return blocks * request.block_size, blocks.astype(np.intp)
    return np.floor(blocks * request.block_size), None


def _survivors(
    guard: LoadGuard | None, f: _Fleet, cached: F64, anchors: list[int]
) -> npt.NDArray[np.bool_]:
    """The load guard's survivors (exact: integer loads); its least loaded is an anchor."""
    n = len(f.items)
    if guard is None or n < 2:
        return np.ones(n, dtype=bool)
    p = guard.p
    loads = f.sums[_S_TOK] if p.metric == "tokens" else f.sums[_S_REQ]
    at = int(np.argmin(loads))
    anchors.append(at)
    lo = float(loads[at])
    cut = max(lo + p.abs_threshold, p.rel_threshold * lo)
    surv: npt.NDArray[np.bool_] = loads <= cut
    if p.keep_cached_tokens:
        surv |= cached >= p.keep_cached_tokens
    return surv


def _costs(
    tc: TTFTCost,
    f: _Fleet,
    request: RequestView,
    cached: tuple[F64, I64 | None],
    k: F64 | None,
    anchors: list[int],
    inputs: list[F64],
) -> F64:
    """ttft-cost's ranking cost per candidate, in the plugin's order of operations (the
    columns it is a function of join ``inputs``; ``cached``: :func:`_cached`'s); the
    candidate with the cheapest own prefill (the recompute term's reference) is an anchor."""
    tc._sync()
    n = request.prompt_tokens
    if cached[1] is not None:
        own, least = _by_blocks(cached[1], request.block_size, n, tc._prefill_ms)
    else:
        clipped = np.clip(cached[0], 0, n)
        own, by_class = _by_class(clipped, request.block_size, lambda c: tc._prefill_ms(n - c, c))
        least = float(by_class.min())
    anchors.append(int(np.argmin(own)))
    pend = f.sums[_S_PEND]
    tput, wait = f.wait(tc.model_tps, tc.p.use_engine_throughput)
    inputs += (own, pend, tput)
    if k is not None:
        inputs.append(k)
    if tc.p.decode:
        inputs.append(f.sums[_S_DEC])
    t: F64 = wait + own
    if not tc.ranked:
        return t
    p = tc.p
    cost: F64 = t + p.interference * (k if k is not None else 0.0) * own
    cost = cost + p.recompute * (own - least)
    if p.decode:
        cost = cost + p.decode * f.sums[_S_DEC] * own
    return cost


def _by_blocks(
    blocks: I64, block_size: int, n: int, prefill_ms: Callable[[int, int], float]
) -> tuple[F64, float]:
    """ttft-cost's own prefill per candidate from its cached whole ``blocks`` (the tokens
    clipped to the prompt's ``n``), computed once per distinct block count, and the least
    of them. Two counts clipped to the same tokens get the same value from the same call."""
    distinct = np.flatnonzero(np.bincount(blocks)).tolist()
    values = []
    for b in distinct:
        c = min(b * block_size, n)
        values.append(prefill_ms(n - c, c))
    table = np.zeros(distinct[-1] + 1)
    table[distinct] = values
    return table[blocks], min(values)


def _by_class(tokens: F64, block_size: int, fn: Callable[[int], float]) -> tuple[F64, F64]:
    """``fn`` of each of ``tokens`` (whole numbers, a few distinct), and of each distinct
    value ascending, computed once per value. Whole blocks (the usual case: cached tokens)
    are told apart by counting, else by sorting."""
    blocks = (tokens // max(1, block_size)).astype(np.intp)
    if block_size > 0 and len(tokens) and bool((blocks * block_size == tokens).all()):
        distinct = np.flatnonzero(np.bincount(blocks))
        by_class = np.array([fn(int(b) * block_size) for b in distinct.tolist()])
        table = np.zeros(int(distinct[-1]) + 1)
        table[distinct] = by_class
        return table[blocks], by_class
    classes = np.unique(tokens)
    by_class = np.array([fn(int(c)) for c in classes.tolist()])
    return by_class[np.searchsorted(classes, tokens)], by_class


def _prefix_scores(pe: PrefixEstimate, request: RequestView, cached: F64) -> F64:
    n = request.prompt_tokens
    if n <= 0 or not request.block_hashes:
        return np.zeros(len(cached))
    r = np.minimum(cached / n, 1.0)
    return np.where(r >= pe.threshold, r, 0.0) if pe.threshold > 0 else r


def _load_scores(ll: LeastLoad, f: _Fleet, surv: npt.NDArray[np.bool_], anchors: list[int]) -> F64:
    """least-load's scores over the survivors' maxima (each maximum's first holder an
    anchor; the metrics are integers or the views' own floats: exact maxima)."""
    n = len(f.items)
    if ll.total_weight <= 0:
        return np.ones(n)
    metrics = f.m[_LOAD_ROWS]
    # each metric's first greatest survivor, all four at once
    tops = np.where(surv, metrics, -np.inf).argmax(axis=1).tolist()
    used = np.zeros(n)
    for w, x, at in zip(ll.weights, metrics, tops, strict=True):
        if not surv[at]:  # every survivor's value is -inf
            at = _first_max(x, surv)
        m = float(x[at])
        if m > 0:
            anchors.append(at)
            used = used + x * (w / (m * ll.total_weight))
    return 1.0 - used


def _session_load_scores(
    sl: SessionLoad,
    request: RequestView,
    now: float,
    f: _Fleet,
    surv: npt.NDArray[np.bool_],
    anchors: list[int],
    extra: list[F64],
) -> F64 | None:
    """session-load's scores (None: it scores nothing); the survivor with the most cached
    tokens (whether the prompt is a new session's) and the most committed (and any within
    rounding of it: numpy's exp is not math's) are anchors. Its inputs per instance (the
    committed tokens and their time) join ``extra``."""
    cached = extra[0]
    n = request.prompt_tokens
    if n <= 0 or n < sl.p.min_prompt_tokens:
        return None
    most = _first_max(cached, surv)
    anchors.append(most)
    if cached[most] >= sl.p.new_below * n:
        return None
    if not sl._committed:
        return None
    v, t = f.committed(sl, now)
    extra += (v, t)
    x = v * np.exp(-sl._rate * np.maximum(0.0, now - t))
    at = _first_max(x, surv)
    top = float(x[at])
    if top <= 0:
        return None
    anchors += _near(at, surv & (x >= top * (1.0 - MARGIN)), [v, t])
    return 1.0 - x / top


def _first_of_equals(sel: npt.NDArray[np.bool_], cols: F64, extra: list[F64]) -> list[int]:
    """The positions in ``sel``, less any whose every plugin input (the view fields and the
    request's ``extra`` columns) equals an earlier one's: rows grouped by a weighted sum of
    their values, each group checked to be one value (else compared one by one)."""
    at = np.flatnonzero(sel)
    if len(at) <= 8:  # a few: dropping their repeats costs more than scoring them
        return list(at.tolist())
    keys = np.concatenate([cols[:, at], *(x[at][None, :] for x in extra)])
    _, first, group = np.unique(_MIX[: len(keys)] @ keys, return_index=True, return_inverse=True)
    if (keys == keys[:, first[group.ravel()]]).all():
        return list(at[np.sort(first)].tolist())
    seen: set[tuple[float, ...]] = set()
    out: list[int] = []
    for i, key in zip(at.tolist(), map(tuple, keys.T.tolist()), strict=True):
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out
