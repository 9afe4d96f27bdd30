"""The pre-filter by score bounds: only the candidates that can win a cycle, and those the
cycle's normalisations are taken from (:class:`BoundFilter`, used by
:class:`~services.sim.narrow.NarrowScheduler`).

At a thousand instances nearly every one holds a prefix of the next prompt (a common
system prompt is routed everywhere), so grouping equal candidates (``narrow.py``) keeps most
of them. For a profile made only of a load guard, one prefix estimate, one ttft-cost, one
least-load and one decode-tpot scorer (and scorers that score nothing for the request:
session-home without a session, session-load below its prompt threshold; the decode-room
filter, which keeps every candidate of a fleet without decode-role endpoints), this filter
computes every candidate's total the way those plugins do, as numpy arrays over the fleet
(kept up to date from the few views that change between cycles), and hands the real
scheduler only

* the candidates whose total is within ``MARGIN`` of the best (the pick is among them: the
  arrays' totals differ from the plugins' by float rounding, far below ``MARGIN``), less any
  whose every input equals an earlier kept one's (equal inputs give bit-equal totals, and
  the picker takes the first best in order), and
* the candidates every cross-candidate quantity is taken from: the guard's least load, the
  cheapest own prefill (ttft-cost's recompute term), the least cost among the guard's
  survivors (ttft-cost's normalisation), each least-load metric's maximum among them, and
  the cheapest own prefill and least decode stall among them (decode-tpot's gate and
  normalisation).

Every kept candidate therefore gets the same scores as among all candidates, bit for bit,
and the first best among them is the first best among all. Any other profile, a request
with a session, or a fleet with prefill or ineligible endpoints: ``plan`` is None and the
grouping pre-filter applies. ``tests/unit/test_sim_bound.py`` and
``tests/unit/test_sim_narrow.py`` compare the decisions with and without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common.routing.framework import MaxScorePicker, Profile
from services.common.routing.plugins.affinity import SessionHome
from services.common.routing.plugins.cost import TTFTCost
from services.common.routing.plugins.estimate import PrefixEstimate
from services.common.routing.plugins.load import LeastLoad, LoadGuard
from services.common.routing.plugins.placement import SessionLoad
from services.common.routing.plugins.room import DecodeRoom
from services.common.routing.plugins.routed_match import RoutedMatch
from services.common.routing.plugins.tpot import DecodeTPOT
from services.common.routing.types import EndpointSnapshot, RequestView
from services.sim.bound_fleet import (
    F64,
    LOAD_ROWS,
    PEND,
    RREQ,
    RUN,
    S_DEC,
    S_PEND,
    S_REQ,
    S_TOK,
    TIF,
    WAIT,
    FleetColumns,
    changed_positions,
)

__all__ = ["MARGIN", "BoundFilter", "BoundPlan", "bound_plan", "changed_positions"]

MARGIN = 1e-9
"""Candidates within this of the best total are kept (totals are at most a few tens; the
arrays' and the plugins' float sums differ by ~1e-14)."""

I64 = npt.NDArray[np.intp]
# weights of the inputs' sum that groups equal candidates (fixed: a run's groups must not
# depend on anything but its inputs; a sum shared by unequal ones is caught and undone)
_MIX: F64 = np.random.default_rng(0).uniform(1.0, 2.0, 32)


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
    tpot: DecodeTPOT | None = None
    w_tpot: float = 0.0


def _one(objs: list[Any]) -> Any:
    distinct = {id(o): o for o in objs}
    return next(iter(distinct.values())) if len(distinct) == 1 else None


def bound_plan(prof: Profile) -> BoundPlan | None:
    """The plan of ``prof``, None when the filter does not apply to it."""
    picker = prof.picker
    if type(picker) is not MaxScorePicker or picker.random_ties:
        return None
    kinds = (PrefixEstimate, TTFTCost, LeastLoad, SessionHome, SessionLoad, DecodeTPOT)
    if any(type(s) not in kinds for s, _ in prof.scorers):
        return None
    # decode-room keeps every candidate here (the pre-filter runs only over a fleet without
    # decode-role endpoints)
    guards = [f for f in prof.filters if type(f) is not DecodeRoom]
    if len(guards) > 1 or any(type(f) is not LoadGuard for f in guards):
        return None
    by: dict[type, list[Any]] = {k: [s for s, _ in prof.scorers if type(s) is k] for k in kinds}
    prefix, ttft, load = (_one(by[k]) for k in (PrefixEstimate, TTFTCost, LeastLoad))
    session_load, tpot = _one(by[SessionLoad]), _one(by[DecodeTPOT])
    for k, one in (
        (PrefixEstimate, prefix), (TTFTCost, ttft), (LeastLoad, load), (SessionLoad, session_load),
        (DecodeTPOT, tpot),
    ):  # fmt: skip
        if by[k] and one is None:
            return None  # two plugins of a type: not handled
    if tpot is not None and ttft is None:
        return None  # decode-tpot prices its stall with ttft-cost's own prefill
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
        session_load, weight[SessionLoad], tpot, weight[DecodeTPOT],
    )  # fmt: skip


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
        self._fleet: FleetColumns | None = None

    def _follow(self, snapshot: EndpointSnapshot) -> FleetColumns:
        f = self._fleet
        if f is None or not f.update(snapshot):
            f = self._fleet = FleetColumns(snapshot)
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
            cost, own = _costs(tc, f, request, (cached, blocks), k, anchors, inputs)
            eps = cost + tc.p.epsilon_ms
            at = _first_min(eps, surv)
            lo = eps[at]
            # the cheapest: ttft-cost's normalisation (and, in case rounding differs, any
            # within MARGIN of it from other inputs)
            anchors += _near(at, surv & (eps <= lo + MARGIN * (1.0 + lo)), inputs)
            total = total + plan.w_ttft * (lo / eps)
            # over decode-role endpoints (P/D) decode-tpot scores every candidate 1
            if plan.tpot is not None and plan.w_tpot and "decode" not in snapshot.roles():
                tp = _tpot_scores(plan.tpot, f, own, surv, anchors)
                if tp is not None:
                    total = total + plan.w_tpot * tp
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


def _cached(
    plan: BoundPlan, f: FleetColumns, request: RequestView, now: float
) -> tuple[F64, I64 | None]:
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
    guard: LoadGuard | None, f: FleetColumns, cached: F64, anchors: list[int]
) -> npt.NDArray[np.bool_]:
    """The load guard's survivors (exact: integer loads); its least loaded is an anchor."""
    n = len(f.items)
    if guard is None or n < 2:
        return np.ones(n, dtype=bool)
    p = guard.p
    loads = f.sums[S_TOK] if p.metric == "tokens" else f.sums[S_REQ]
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
    f: FleetColumns,
    request: RequestView,
    cached: tuple[F64, I64 | None],
    k: F64 | None,
    anchors: list[int],
    inputs: list[F64],
) -> tuple[F64, F64]:
    """ttft-cost's ranking cost and own prefill per candidate, in the plugin's order of
    operations (the columns the cost is a function of join ``inputs``; ``cached``:
    :func:`_cached`'s); the candidate with the cheapest own prefill (the recompute term's
    reference) is an anchor."""
    tc._sync()
    n = request.prompt_tokens
    if cached[1] is not None:
        own, least = _by_blocks(cached[1], request.block_size, n, tc._prefill_ms)
    else:
        clipped = np.clip(cached[0], 0, n)
        own, by_class = _by_class(clipped, request.block_size, lambda c: tc._prefill_ms(n - c, c))
        least = float(by_class.min())
    anchors.append(int(np.argmin(own)))
    pend = f.sums[S_PEND]
    tput, wait = f.wait(tc.model_tps, tc.p.use_engine_throughput)
    inputs += (own, pend, tput)
    if k is not None:
        inputs.append(k)
    if tc.p.decode:
        inputs.append(f.sums[S_DEC])
    t: F64 = wait + own
    if not tc.ranked:
        return t, own
    p = tc.p
    cost: F64 = t + p.interference * (k if k is not None else 0.0) * own
    cost = cost + p.recompute * (own - least)
    if p.decode:
        cost = cost + p.decode * f.sums[S_DEC] * own
    return cost, own


def _tpot_scores(
    dt: DecodeTPOT, f: FleetColumns, own: F64, surv: npt.NDArray[np.bool_], anchors: list[int]
) -> F64 | None:
    """decode-tpot's scores (None: every candidate scores 1, the prompt's own prefill is
    short somewhere), the operations of ``stall_ms_per_token`` over the columns. The
    survivor with the cheapest own prefill (the gate) and the least stall (the
    normalisation; any within rounding of it) are anchors. Its inputs are view fields and
    ``own``, a function of the cached tokens: no new per-request column."""
    p = dt.p
    cheapest = _first_min(own, surv)
    anchors.append(cheapest)
    if own[cheapest] < p.min_prefill_ms:
        return None
    c = f.cols
    run = c[RUN]
    decodes = run + (c[WAIT] + c[RREQ]) if p.count_queued else run
    remaining = np.maximum(0.0, c[TIF] - c[PEND])
    measured = (run > 0) & (remaining > 0)
    per = np.full(len(run), float(p.decode_tokens))
    np.divide(remaining, run, out=per, where=measured)
    per = np.maximum(per, float(p.min_remaining_tokens))
    stalls = np.zeros(len(run))
    np.divide(own, per, out=stalls, where=(decodes > 0) & (own > 0))
    stalls = decodes * stalls + p.epsilon_ms
    at = _first_min(stalls, surv)
    lo = float(stalls[at])
    anchors += _near(
        at, surv & (stalls <= lo + MARGIN * (1.0 + lo)), [own, *c[[RUN, WAIT, RREQ, TIF, PEND]]]
    )
    out: F64 = (
        np.maximum(0.0, 1.0 - (stalls - lo) / p.spread_ms) if p.spread_ms > 0 else lo / stalls
    )
    return out


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


def _load_scores(
    ll: LeastLoad, f: FleetColumns, surv: npt.NDArray[np.bool_], anchors: list[int]
) -> F64:
    """least-load's scores over the survivors' maxima (each maximum's first holder an
    anchor; the metrics are integers or the views' own floats: exact maxima)."""
    n = len(f.items)
    if ll.total_weight <= 0:
        return np.ones(n)
    metrics = f.m[LOAD_ROWS]
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
    f: FleetColumns,
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
