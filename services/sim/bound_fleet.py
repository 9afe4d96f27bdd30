"""The fleet's view fields as numpy columns for the bound pre-filter
(:mod:`services.sim.bound`): followed from one snapshot to the next by the views that
changed, with the sums the plugins take of them and the per-request inputs it keeps up to
date (ttft-cost's unanswered picks, session-load's commitments) from the instances their
plugins mark as touched. The same float operations in the same order as the plugins', so
the same values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress, count
from operator import is_not
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common.routing.plugins.pending import PendingPicks
from services.common.routing.plugins.placement import SessionLoad
from services.common.routing.types import EndpointSnapshot, EndpointView
from services.sim.routed_cols import RoutedColumns

__all__ = [
    "F64", "LOAD_ROWS", "PEND", "RREQ", "RUN", "S_DEC", "S_PEND", "S_REQ", "S_TOK", "TIF", "WAIT",
    "FleetColumns", "changed_positions",
]  # fmt: skip

F64 = npt.NDArray[np.float64]

# the view fields a plugin of the plan reads (rows of FleetColumns.cols)
RUN, WAIT, TIF, PEND, KV, TPS, RREQ, RTOK = range(8)
NROW = 8


def _row(e: EndpointView) -> tuple[float, ...]:
    return (
        e.running, e.waiting, e.tokens_in_flight, e.pending_prefill_tokens, e.kv_usage,
        e.prefill_tokens_per_s, e.reserved_requests, e.reserved_tokens,
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


class FleetColumns:
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
        self.cols: F64 = self.m[:NROW]
        self.sums: F64 = self.m[NROW:]
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
            pend = self.sums[S_PEND]
            tput = np.full(len(self.items), model_tps)
            if engine:
                tput = np.maximum(tput, self.cols[TPS])
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


# rows of FleetColumns.sums
S_TOK, S_REQ, S_PEND, S_WAITING, S_DEC = range(5)
# least-load's metrics (waiting, running, tokens, KV usage) as rows of FleetColumns.m
LOAD_ROWS = [NROW + S_WAITING, RUN, NROW + S_TOK, KV]


def _sums(r: Any) -> tuple[Any, ...]:
    """The rows of ``FleetColumns.sums`` from the columns' rows (``r``: ``FleetColumns.cols``), or one
    view's column of them from its row (``r``: ``_row``'s tuple): the same additions in the
    same order, so the same values."""
    return (
        r[TIF] + r[RTOK], r[RUN] + r[WAIT] + r[RREQ], r[PEND] + r[RTOK],
        r[WAIT] + r[RREQ], r[RUN] + r[RREQ],
    )  # fmt: skip


def _wait(r: tuple[float, ...], model_tps: float, engine: bool) -> tuple[float, float]:
    """One view's (throughput, wait) of :meth:`FleetColumns.wait`."""
    pend = r[PEND] + r[RTOK]
    tput = max(model_tps, r[TPS]) if engine else model_tps
    return tput, (1000.0 * pend / tput if pend > 0 and tput > 0 else 0.0)
