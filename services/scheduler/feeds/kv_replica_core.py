"""Scheduler-local replica of the KV index (pure core), fed by the engines' KV events.

In the manner of NVIDIA Dynamo's KV router, which keeps its own indexer fed by engine KV
events: the scheduler answers "which instance holds how much of this prompt's block chain,
per tier" from memory instead of asking kvmeta ``MatchPrefix`` before every cycle. kvmeta
stays the source of truth for every other service; this copy is a **routing hint**: a stale
or missing entry costs cache hits (a worse pick), never correctness.

The index itself (slots, the epoch/seq sequencer with gap detection, the chain match, the
resync back-off) is the shared pure core :mod:`services.common.kvindex`, the same one kvmeta
runs: one :class:`~services.common.kvindex.ChainIndex` for the scheduler's deployment (the
shell filters other deployments). What is the scheduler's own here: answers as routing
:class:`PrefixMatch` objects with tier names (shared between answers for single-tier
matches), forgetting instances that left the fleet (:meth:`KVReplica.retain`), and the
bookkeeping of its resync requests (:meth:`KVReplica.due_resyncs`).

No I/O, no clock, no asyncio: time (``now``, seconds) is a parameter where needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat

from services.common.kvindex import (
    ALL_CLEARED,
    REMOVED,
    STORED,
    ChainIndex,
    EventLike,
    InstanceInfo,
    Outstanding,
    ResyncPolicy,
    StaleInstance,
    Verdict,
    match_chain,
    plan_resyncs,
)
from services.common.routing.types import PrefixMatch, Tier

__all__ = [
    "ALL_CLEARED",
    "REMOVED",
    "STORED",
    "TIER_NAMES",
    "EventLike",
    "InstanceInfo",
    "KVReplica",
    "Verdict",
]

# KVEvent tier numbers (tideserve.v1.Tier) → routing tier names; 0 (unspecified) is GPU.
TIER_NAMES: dict[int, Tier] = {0: "gpu", 1: "gpu", 2: "cpu", 3: "ssd", 4: "remote"}


class KVReplica(ChainIndex):
    """The replica of one deployment's KV index: the shared :class:`ChainIndex` (``apply``,
    ``instances``, ``stale_instances``, ``entry_count``, ``compact``, ``retired_slots``) plus
    routing answers, fleet retention and resync bookkeeping. Not thread-safe: one owner
    mutates it.

    ``resync_after_s`` / ``max_resync_after_s``: a stale instance is asked for its full
    state at once, then again after ``resync_after_s`` doubling per attempt up to the max,
    while it stays stale (see :meth:`due_resyncs`).
    """

    def __init__(self, *, resync_after_s: float = 5.0, max_resync_after_s: float = 60.0) -> None:
        super().__init__()
        self.policy = ResyncPolicy(resync_after_s, max_resync_after_s)
        self._asked: dict[tuple[str, str], Outstanding] = {}
        self._absent: dict[str, float] = {}  # instance -> when it was first seen absent
        self._single: dict[tuple[int, Tier], PrefixMatch] = {}

    def drop_instance(self, instance_id: str) -> bool:
        """Forget an instance and its blocks (it left the fleet). Idempotent."""
        self._asked.pop(("", instance_id), None)
        return self.drop(instance_id)

    def retain(self, present: Iterable[str], now: float, grace_s: float) -> list[str]:
        """Drop instances missing from ``present`` (e.g. the fleet's ids) at every call for
        at least ``grace_s``; returns the dropped ids, sorted. An instance that comes back
        in time is kept; one dropped and seen again in KV events starts over (its next
        batch is a gap, so it is stale until its full state)."""
        keep = set(present)
        known = self.state.instances
        gone: list[str] = []
        for iid in sorted(known):
            if iid in keep:
                self._absent.pop(iid, None)
                continue
            since = self._absent.setdefault(iid, now)
            if now - since >= grace_s:
                self.drop_instance(iid)
                gone.append(iid)
        for iid in [i for i in self._absent if i not in known]:
            del self._absent[iid]
        return gone

    # ----------------------------------------------------------------- query
    def match(
        self,
        block_hashes: Sequence[int],
        tenant: str = "",
        lora: str = "",
        candidates: Iterable[str] | None = None,
    ) -> dict[str, PrefixMatch]:
        """Longest held prefix of the chain per instance, split by tier — the shape the
        precise-prefix plugin reads (``RequestView.prefix_matches``). Only live (non-stale)
        instances with at least one matched block appear; ``candidates`` (ids) narrows
        them. A block held in several tiers counts in each. The returned PrefixMatch
        objects may be shared between answers: read-only."""
        m = match_chain(self.state, tenant, lora, block_hashes, candidates)
        out: dict[str, PrefixMatch] = {}
        if m.tier:
            # one shared PrefixMatch per matched length
            name = TIER_NAMES.get(m.tier, "gpu")
            single = self._single
            for ids, k in m.runs:
                pm = single.get((k, name))
                if pm is None:
                    if len(single) >= 65_536:
                        single.clear()
                    pm = single[(k, name)] = PrefixMatch(matched_blocks=k, tiers={name: k})
                if out:
                    out.update(zip(ids, repeat(pm)))
                else:
                    out = dict.fromkeys(ids, pm)
            return out
        for ids, k in m.runs:
            for iid in ids:
                out[iid] = PrefixMatch(matched_blocks=k, tiers=_named(m.tiers[iid]))
        return out

    # ----------------------------------------------------------------- resync
    def due_resyncs(self, now: float) -> list[tuple[str, int]]:
        """(instance id, epoch) of the stale instances to ask for a full state at ``now``,
        sorted by id, and records them as asked (``plan_resyncs``: one outstanding request
        per instance, repeated with back-off while it stays stale, at once if its epoch
        changed). A failed publish should be followed by :meth:`forget_asked`."""
        stale = [StaleInstance("", i.instance_id, i.seq.epoch)
                 for i in self.state.instances.values() if i.seq.stale]  # fmt: skip
        plan = plan_resyncs(stale, self._asked, now, self.policy)
        self._asked = plan.outstanding
        return [(s.instance_id, s.epoch) for s in plan.send]

    def forget_asked(self, instance_ids: Iterable[str]) -> None:
        """Undo :meth:`due_resyncs` for these (their requests were not published)."""
        for iid in instance_ids:
            self._asked.pop(("", iid), None)


def _named(tiers: Mapping[int, int]) -> dict[Tier, int]:
    out: dict[Tier, int] = {}
    for t, c in tiers.items():
        name = TIER_NAMES.get(t, "gpu")
        out[name] = out.get(name, 0) + c
    return out
