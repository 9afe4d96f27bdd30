"""Prefix matches with what the KV-cache tier can supply (pure).

Rule: the tier (``kvcache`` segments in the object master) holds the prompt's leading
``tier_run`` blocks as objects. Every candidate instance can fetch them, so its match is
extended to ``tier_run`` blocks when it holds fewer itself: the blocks beyond its own match
count in ``TIER_REMOTE`` (the router's prefix credit weighs them as such), the ones it holds
keep their tiers. Instances the tier cannot extend are returned unchanged; the answer stays
ordered longest first, then by id, and lists only instances with a match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from tideserve.v1 import common_pb2

from services.common.dataplane.blocks import block_key
from services.kvmeta.index import InstanceMatch, PrefixIndex, UnknownDeploymentError

__all__ = ["Exist", "leading_run", "on_gpu_and_tier", "with_fetchable"]

REMOTE = common_pb2.TIER_REMOTE
GPU = common_pb2.TIER_GPU

Exist = Callable[[str, str, Iterable[str]], list[bool]]  # ObjectMaster.exist


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


def on_gpu_and_tier(
    index: PrefixIndex,
    exist: Exist,
    deployment: str,
    tenant: str,
    instance: str,
    chain: Sequence[int],
) -> tuple[int, int]:
    """Of ``chain``'s leading blocks: how many the index has on ``instance``'s GPU (from its
    KV events; a deployment the index has never seen counts as all of them: nothing is
    known to be gone), and how many the tier holds (leading run, under the engines' tenant
    "", as :class:`~services.common.dataplane.tier.KVTier` stores them)."""
    try:
        found = index.match_prefix(deployment, tenant, chain, [instance])
    except UnknownDeploymentError:
        return len(chain), 0
    gpu = next((m.tiers.get(GPU, 0) for m in found if m.instance_id == instance), 0)
    return gpu, leading_run(exist(deployment, "", [block_key(h) for h in chain]))
