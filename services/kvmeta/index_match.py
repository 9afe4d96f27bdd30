"""Chain matching over the prefix index's holder tables (see :mod:`services.kvmeta.index`).

Pure: no I/O, no clock. Walks the chain once, ANDing holder masks of the live candidate
slots and stopping when none is left; with several tiers, per-slot block counts per tier are
kept as bit-sliced counters (one int per bit of the count, all slots at once).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.kvmeta.index_state import DepState, holder_mask

__all__ = ["InstanceMatch", "match_chain"]


@dataclass(frozen=True)
class InstanceMatch:
    instance_id: str
    matched_blocks: int
    tiers: dict[int, int]


def match_chain(
    dep: DepState,
    tenant: str,
    lora: str,
    block_hashes: Sequence[int],
    candidates: Iterable[str] | None = None,
) -> list[InstanceMatch]:
    """Longest chain prefix per live instance of ``dep``, split by tier; longest first,
    then by id. Only instances with at least one matched block are returned."""
    space = dep.spaces.get((tenant, lora))
    alive = dep.live
    if candidates is not None:
        cmask = 0
        for iid in candidates:
            inst = dep.instances.get(iid)
            if inst is not None:
                cmask |= 1 << inst.slot
        alive &= cmask
    if not space or not alive or not block_hashes:
        return []
    tables = [(t, d) for t, d in sorted(space.items()) if d]
    lengths: dict[int, int] = {}
    counters: dict[int, list[int]] = {}
    n = len(block_hashes)
    if len(tables) == 1:
        get = tables[0][1].get
        for i, h in enumerate(block_hashes):
            v = get(h)
            nxt = 0 if v is None else alive & holder_mask(v)
            if nxt != alive:
                if i:
                    _record(alive ^ nxt, i, lengths)
                alive = nxt
                if not alive:
                    break
    else:
        for i, h in enumerate(block_hashes):
            per: list[tuple[int, int]] = []
            union = 0
            for t, d in tables:
                v = d.get(h)
                if v is not None:
                    m = holder_mask(v) & alive
                    if m:
                        per.append((t, m))
                        union |= m
            nxt = union
            if nxt != alive:
                if i:
                    _record(alive ^ nxt, i, lengths)
                alive = nxt
                if not alive:
                    break
            for t, m in per:
                _add_bits(counters.setdefault(t, []), m)
    _record(alive, n, lengths)
    out: list[InstanceMatch] = []
    single_tier = tables[0][0] if len(tables) == 1 else 0
    for slot, length in lengths.items():
        inst = dep.owners.get(slot)
        if inst is None or length == 0:
            continue
        if single_tier:
            tiers = {single_tier: length}
        else:
            tiers = {}
            for t, planes in counters.items():
                c = sum(((p >> slot) & 1) << k for k, p in enumerate(planes))
                if c:
                    tiers[t] = c
        out.append(InstanceMatch(inst.instance_id, length, tiers))
    out.sort(key=lambda m: (-m.matched_blocks, m.instance_id))
    return out


def _record(dropped: int, length: int, lengths: dict[int, int]) -> None:
    while dropped:
        low = dropped & -dropped
        lengths[low.bit_length() - 1] = length
        dropped ^= low


def _add_bits(planes: list[int], m: int) -> None:
    """Bit-sliced add of 1 to the per-slot counters selected by ``m``."""
    carry = m
    for k, p in enumerate(planes):
        planes[k] = p ^ carry
        carry &= p
        if not carry:
            return
    planes.append(carry)
