"""Prefix matches with what the KV-cache tier can supply (pure).

Rule: the tier (``kvcache`` segments in the object master) holds the prompt's leading
``tier_run`` blocks as objects. Every candidate instance can fetch them, so its match is
extended to ``tier_run`` blocks when it holds fewer itself: the blocks beyond its own match
count in ``TIER_REMOTE`` (the router's prefix credit weighs them as such), the ones it holds
keep their tiers. Instances the tier cannot extend are returned unchanged; the answer stays
ordered longest first, then by id, and lists only instances with a match.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tideserve.v1 import common_pb2

from services.kvmeta.index import InstanceMatch

__all__ = ["leading_run", "with_fetchable"]

REMOTE = common_pb2.TIER_REMOTE


def leading_run(held: Iterable[bool]) -> int:
    """How many leading flags are true."""
    n = 0
    for there in held:
        if not there:
            break
        n += 1
    return n


def with_fetchable(
    matches: Sequence[InstanceMatch], candidates: Iterable[str], tier_run: int
) -> list[InstanceMatch]:
    """``matches`` with every candidate's match extended to the tier's ``tier_run``."""
    if tier_run <= 0:
        return list(matches)
    by_id = {m.instance_id: m for m in matches}
    for iid in candidates:
        m = by_id.get(iid)
        own = m.matched_blocks if m is not None else 0
        if own >= tier_run:
            continue
        tiers = dict(m.tiers) if m is not None else {}
        tiers[REMOTE] = tiers.get(REMOTE, 0) + tier_run - own
        by_id[iid] = InstanceMatch(iid, tier_run, tiers)
    return sorted(by_id.values(), key=lambda m: (-m.matched_blocks, m.instance_id))
