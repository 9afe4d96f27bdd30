"""Fewer candidates per routing cycle, the same decisions: the simulator's pre-filter.

At a thousand instances most of a cycle's work is scoring endpoints that cannot differ:
idle ones, or ones with the same load and nothing of the request's prefix. The live
gateway keeps scoring them all; :class:`NarrowScheduler` (the scheduler the simulated
gateways run) gives the real :class:`~services.scheduler.routing.framework.Scheduler` the
snapshot without such repeats when that provably changes nothing:

* Every plugin of the profile is one of :data:`SAFE`: each scores (or keeps) a candidate by
  its view's load fields and what the plugin holds for that instance (the request's routed
  or reported prefix there, this gateway's unanswered picks there), and looks across the
  candidates only through a minimum or a maximum. The picker is the built-in max-score
  picker without random ties (the first best in id order wins).
* The request has no session (the session-home scorer hashes the candidates' ids), its
  prompt is shorter than a session-load plugin's ``min_prompt_tokens`` (below it that plugin
  scores nothing), and the fleet has no prefill endpoints (the P/D decider sees one pool).

Then two candidates with equal load fields that no plugin holds anything for get equal
scores from every plugin, bit for bit, and removing the later one changes no minimum or
maximum; so the first of each such group stands for the others, and since the picker takes
the first best in id order, it picks what it would have picked among all of them. Any other
profile or request gets the whole snapshot. ``tests/unit/test_sim_narrow.py`` runs the
simulator both ways and requires the same results.
"""

from __future__ import annotations

from typing import Any

from services.scheduler.routing.framework import MaxScorePicker, Profile, Scheduler
from services.scheduler.routing.plugins.affinity import SessionHome
from services.scheduler.routing.plugins.cost import TTFTCost
from services.scheduler.routing.plugins.estimate import PrefixEstimate
from services.scheduler.routing.plugins.load import LeastLoad, LoadGuard
from services.scheduler.routing.plugins.placement import SessionLoad
from services.scheduler.routing.types import (
    Decision,
    EndpointSnapshot,
    EndpointView,
    RequestView,
)

__all__ = ["SAFE", "NarrowScheduler"]

SAFE: tuple[type, ...] = (PrefixEstimate, LoadGuard, TTFTCost, LeastLoad, SessionHome, SessionLoad)
"""The plugin types whose results the pre-filter keeps (see the module docstring)."""


def _key(e: EndpointView) -> tuple[Any, ...]:
    """What a :data:`SAFE` plugin reads of a view besides its id."""
    return (
        e.role, e.running, e.waiting, e.tokens_in_flight, e.pending_prefill_tokens, e.kv_usage,
        e.prefill_tokens_per_s, e.reserved_requests, e.reserved_tokens, e.circuit,
    )  # fmt: skip


class NarrowScheduler(Scheduler):
    """``base``'s profiles, RNG and plugins (the same objects), with the pre-filter."""

    def __init__(self, base: Scheduler) -> None:
        super().__init__(
            base.profiles,
            base.default_profile,
            base.rng,
            decode_can_prefill=base.decode_can_prefill,
        )
        self._safe: dict[str, tuple[bool, PrefixEstimate | None, tuple[TTFTCost, ...]]] = {}
        self.narrowed = 0  # cycles that ran over fewer candidates (diagnostics)
        self._keys: dict[int, tuple[EndpointView, tuple[Any, ...]]] = {}
        self._hint: tuple[str, float, object, dict[str, int]] | None = None

    def hint(self, request_id: str, now: float, index: object, match: dict[str, int]) -> None:
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
        return super().schedule(request, small, now, profile)

    def _plan(self, prof: Profile) -> tuple[bool, PrefixEstimate | None, tuple[TTFTCost, ...]]:
        """(whether the profile is safe, its prefix estimate, its ttft-cost plugins)."""
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
            costs = tuple(p for p in plugins if isinstance(p, TTFTCost))
            hit = self._safe[prof.name] = (safe, prefix[0] if prefix else None, costs)
        return hit

    def _applies(self, prof: Profile, request: RequestView, snapshot: EndpointSnapshot) -> bool:
        if request.session_id or request.exclude or not self._plan(prof)[0]:
            return False
        for s, _ in prof.scorers:
            if isinstance(s, SessionLoad) and request.prompt_tokens >= s.p.min_prompt_tokens:
                return False
        return not snapshot.pools()[2]

    def _narrow(
        self, prof: Profile, request: RequestView, snapshot: EndpointSnapshot, now: float
    ) -> EndpointSnapshot:
        if not self._applies(prof, request, snapshot):
            return snapshot
        _, prefix, costs = self._plan(prof)
        held: set[str] = set(request.prefix_matches or ())
        if prefix is not None and request.block_hashes:
            # the lookup the plugin makes in this cycle (the same time: no further expiry)
            h = self._hint
            if (
                h is not None
                and h[0] == request.request_id
                and h[1] == now
                and h[2] is prefix.index
            ):
                match = h[3]
            else:
                match = prefix.index.match(request.block_hashes, now)
            held.update(i for i, n in match.items() if n)
        self._hint = None
        awaiting = [c.awaiting for c in costs]
        keys = self._keys
        if len(keys) > 4 * len(snapshot) + 1024:  # views replaced since: forget them
            keys.clear()
        seen: set[tuple[Any, ...]] = set()
        kept: list[EndpointView] = []
        for e in snapshot:
            iid = e.instance_id
            if not e.eligible or iid in held or any(a(iid) for a in awaiting):
                kept.append(e)
                continue
            hit = keys.get(id(e))
            if hit is None or hit[0] is not e:
                hit = keys[id(e)] = (e, _key(e))
            k = hit[1]
            if k not in seen:
                seen.add(k)
                kept.append(e)
        if len(kept) == len(snapshot):
            return snapshot
        return EndpointSnapshot(kept, version=snapshot.version, presorted=True)
