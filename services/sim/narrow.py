"""Fewer candidates per routing cycle, the same decisions: the simulator's pre-filter.

At a thousand instances most of a cycle's work is scoring endpoints that cannot differ:
idle ones, or ones with the same load and nothing of the request's prefix. The live
gateway keeps scoring them all; :class:`NarrowScheduler` (the scheduler the simulated
gateways run) gives the real :class:`~services.common.routing.framework.Scheduler` the
snapshot without such repeats when that provably changes nothing:

* Every plugin of the profile is one of :data:`SAFE`: each scores (or keeps) a candidate by
  its view's load fields and what the plugin holds for that instance (the request's routed
  or reported prefix there, this gateway's unanswered picks there), and looks across the
  candidates only through a minimum or a maximum. The picker is the built-in max-score
  picker without random ties (the first best in id order wins).
* The request has no session (the session-home scorer hashes the candidates' ids), its
  prompt is shorter than a session-load plugin's ``min_prompt_tokens`` (below it that plugin
  scores nothing), and the fleet has no prefill endpoints (the P/D decider sees one pool)
  and, for a profile with the decode-room filter, no decode-role endpoints (it keeps every
  other candidate).

Then two candidates with equal load fields that no plugin holds anything for get equal
scores from every plugin, bit for bit, and removing the later one changes no minimum or
maximum; so the first of each such group stands for the others, and since the picker takes
the first best in id order, it picks what it would have picked among all of them. Any other
profile or request gets the whole snapshot. ``tests/unit/test_sim_narrow.py`` runs the
simulator both ways and requires the same results.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter
from collections.abc import Mapping
from typing import Any

from services.common.routing.framework import MaxScorePicker, Profile, Scheduler
from services.common.routing.plugins.affinity import SessionHome
from services.common.routing.plugins.cost import TTFTCost
from services.common.routing.plugins.estimate import PrefixEstimate
from services.common.routing.plugins.load import LeastLoad, LoadGuard
from services.common.routing.plugins.placement import SessionLoad
from services.common.routing.plugins.room import DecodeRoom
from services.common.routing.plugins.tpot import DecodeTPOT
from services.common.routing.types import (
    Decision,
    EndpointSnapshot,
    EndpointView,
    Pick,
    RequestView,
)
from services.sim.bound import BoundFilter, BoundPlan, bound_plan, changed_positions

__all__ = ["SAFE", "NarrowScheduler"]

SAFE: tuple[type, ...] = (
    PrefixEstimate, LoadGuard, TTFTCost, LeastLoad, SessionHome, SessionLoad, DecodeRoom,
    DecodeTPOT,
)  # fmt: skip
"""The plugin types whose results the pre-filter keeps (see the module docstring; the
decode-room filter only over a fleet without decode-role endpoints, where it keeps all)."""

Key = tuple[Any, ...]

BOUND_MIN = 64
"""Fleets from this size on take the bound pre-filter (:mod:`services.sim.bound`) where it
applies: below, its array operations cost more than scoring every candidate."""


def _key(e: EndpointView) -> Key | None:
    """What a :data:`SAFE` plugin reads of a view besides its id; None: not eligible."""
    if not e.eligible:
        return None
    return (
        e.role, e.running, e.waiting, e.tokens_in_flight, e.pending_prefill_tokens, e.kv_usage,
        e.prefill_tokens_per_s, e.reserved_requests, e.reserved_tokens, e.circuit,
    )  # fmt: skip


class _Groups:
    """A snapshot's endpoints grouped by :func:`_key` (positions ascending), kept up to date
    from one snapshot to the next by the views that changed (the fleet patches a few)."""

    def __init__(self, snapshot: EndpointSnapshot) -> None:
        self.items = tuple(snapshot)
        self.pos = {e.instance_id: i for i, e in enumerate(self.items)}
        self.keys: list[Key | None] = []
        self.groups: dict[Key | None, list[int]] = {}
        for i, e in enumerate(self.items):
            k = _key(e)
            self.keys.append(k)
            self.groups.setdefault(k, []).append(i)

    def update(self, snapshot: EndpointSnapshot) -> bool:
        """Follow ``snapshot``; False when its endpoints are not the same ones (rebuild)."""
        new = tuple(snapshot)
        changed = changed_positions(self.items, new)
        if changed is None:
            return False
        for i in changed:
            k, was = _key(new[i]), self.keys[i]
            if k != was:
                members = self.groups[was]
                members.remove(i)
                if not members:
                    del self.groups[was]
                insort(self.groups.setdefault(k, []), i)
                self.keys[i] = k
        self.items = new
        return True

    def kept(self, held: set[str]) -> list[int]:
        """The positions of every endpoint in ``held`` or not eligible, and of the first of
        each group of the others, ascending."""
        pos = self.pos
        held_at = {pos[i] for i in held if i in pos}
        out = list(held_at)
        for k, members in self.groups.items():
            if k is None:
                out.extend(i for i in members if i not in held_at)
            elif members[0] not in held_at:
                out.append(members[0])
            else:
                for i in members:
                    if i not in held_at:
                        out.append(i)
                        break
        out.sort()
        return out


class NarrowScheduler(Scheduler):
    """``base``'s profiles, RNG and plugins (the same objects), with the pre-filter."""

    def __init__(self, base: Scheduler) -> None:
        super().__init__(
            base.profiles,
            base.default_profile,
            base.rng,
            decode_can_prefill=base.decode_can_prefill,
        )
        self._safe: dict[str, tuple[bool, PrefixEstimate | None, bool]] = {}
        self.narrowed = 0  # cycles that ran over fewer candidates (diagnostics)
        self._groups: _Groups | None = None
        self._hint: tuple[str, float, object, Mapping[str, int]] | None = None
        # this scheduler's picks not settled yet, per target: a superset of what ttft-cost
        # counts as awaiting (it also forgets picks after a while)
        self._unsettled: Counter[str] = Counter()
        self._bounds: dict[str, BoundPlan | None] = {}
        self._bound = BoundFilter()

    def hint(self, request_id: str, now: float, index: object, match: Mapping[str, int]) -> None:
        """The shell looked up ``index`` for the next cycle already (its ``match``): the
        pre-filter uses it instead of a lookup of its own when it is the profile's index."""
        self._hint = (request_id, now, index, match)

    def schedule(
        self, request: RequestView, snapshot: EndpointSnapshot, now: float, profile: str = ""
    ) -> Decision:
        prof = self.profiles[profile or self.default_profile]
        small = self._narrow(prof, request, snapshot, now)
        if small is not snapshot:
            self.narrowed += 1
        d = super().schedule(request, small, now, profile)
        if isinstance(d, Pick):
            self._unsettled[(d.prefill or d.decode).endpoint.instance_id] += 1
        return d

    def settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        super().settle(request, pick, ok)
        target = (pick.prefill or pick.decode).endpoint.instance_id
        if target not in self._unsettled:
            return
        left = self._unsettled[target] - 1
        if left > 0:
            self._unsettled[target] = left
        else:
            del self._unsettled[target]

    def _plan(self, prof: Profile) -> tuple[bool, PrefixEstimate | None, bool]:
        """(whether the profile is safe, its prefix estimate, whether it has a decode-room
        filter: safe only over a fleet without decode-role endpoints)."""
        hit = self._safe.get(prof.name)
        if hit is None:
            seen: dict[int, object] = {}
            for p in (*prof.preparers, *prof.filters, *(s for s, _ in prof.scorers)):
                seen.setdefault(id(p), p)
            plugins = list(seen.values())
            prefix = [p for p in plugins if isinstance(p, PrefixEstimate)]
            picker = prof.picker
            safe = (
                all(isinstance(p, SAFE) for p in plugins)
                and len(prefix) <= 1
                and type(picker) is MaxScorePicker
                and not picker.random_ties
            )
            room = any(isinstance(p, DecodeRoom) for p in plugins)
            hit = self._safe[prof.name] = (safe, prefix[0] if prefix else None, room)
        return hit

    def _applies(self, prof: Profile, request: RequestView, snapshot: EndpointSnapshot) -> bool:
        for s, _ in prof.scorers:
            if isinstance(s, SessionLoad) and request.prompt_tokens >= s.p.min_prompt_tokens:
                return False
        return not snapshot.pool_sizes()[2]

    def _held(self, prefix: PrefixEstimate | None, request: RequestView, now: float) -> set[str]:
        """The instances some plugin holds something for in this cycle."""
        held: set[str] = set(request.prefix_matches or ())
        held.update(self._unsettled)
        hint, self._hint = self._hint, None
        if prefix is not None and request.block_hashes:
            # the lookup the plugin makes in this cycle (the same time: no further expiry)
            if (
                hint is not None
                and hint[0] == request.request_id
                and hint[1] == now
                and hint[2] is prefix.index
            ):
                match = hint[3]
            else:
                match = prefix.index.match(request.block_hashes, now)
            held.update(i for i, n in match.items() if n)
        return held

    def _narrow(
        self, prof: Profile, request: RequestView, snapshot: EndpointSnapshot, now: float
    ) -> EndpointSnapshot:
        safe, _, room = self._plan(prof)
        if request.session_id or request.exclude or not safe:
            self._hint = None
            return snapshot
        if room and "decode" in snapshot.roles():
            self._hint = None
            return snapshot
        if prof.name not in self._bounds:
            self._bounds[prof.name] = bound_plan(prof)
        plan = self._bounds[prof.name]
        n_eligible, n_decode, _ = snapshot.pool_sizes()
        big = len(snapshot) >= BOUND_MIN
        if big and plan is not None and n_eligible == len(snapshot) == n_decode:
            self._hint = None
            kept = self._bound.kept(plan, request, snapshot, now)
            return snapshot if len(kept) == len(snapshot) else snapshot.subset(kept)
        if not self._applies(prof, request, snapshot):
            self._hint = None
            return snapshot
        held = self._held(self._plan(prof)[1], request, now)
        g = self._groups
        if g is None or not g.update(snapshot):
            g = self._groups = _Groups(snapshot)
        kept = g.kept(held)
        if len(kept) == len(snapshot):
            return snapshot
        return snapshot.subset(kept)
