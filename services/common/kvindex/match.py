"""Chain match: the longest held prefix of a block-hash chain per live instance, by tier.

Contract: :func:`match_chain` answers, for one (tenant, lora) namespace of an
:class:`~services.common.kvindex.slots.IndexState`, how many leading blocks of the chain each
live (non-stale) instance holds in any tier (``candidates`` narrows the instances), and with
several tiers how many of those blocks sit in each tier (a block held in several tiers
counts in each). Only instances with at least one matched block appear. The answer is a
frozen :class:`ChainMatch`; the caller converts it to its own types.

How: the holder masks along the chain are ANDed in C (``itertools.accumulate``) starting
from the live mask, and the points where instances drop out are found by bisection; per-tier
counts are bit-sliced (one int per bit of the count, all slots at once); the owner ids of a
run's slot mask are memoized in the state until its owners change. Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import and_, or_

from services.common.kvindex.slots import PACK_FROM, IndexState, holder_mask

__all__ = ["NO_MATCH", "ChainMatch", "mask_drops", "match_chain"]


@dataclass(frozen=True, slots=True)
class ChainMatch:
    """Instances grouped by matched length.

    ``runs``: (instance ids, matched blocks) per distinct length, shortest first; ids in slot
    order. ``tier``: the namespace's only tier (all of a run's blocks are there) or 0 when it
    has several, then ``tiers`` gives each instance's blocks per tier.
    """

    runs: tuple[tuple[tuple[str, ...], int], ...] = ()
    tier: int = 0
    tiers: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def lengths(self) -> dict[str, int]:
        """Matched blocks per instance."""
        return {iid: k for ids, k in self.runs for iid in ids}


NO_MATCH = ChainMatch()
_MEMO_MAX = 4096  # slot masks whose owner ids are remembered (typical runs recur)


def _column(d: dict[int, int], hashes: Sequence[int], packed: bool) -> list[int]:
    col = list(map(d.get, hashes, repeat(0)))
    if packed and min(col) < 0:
        col = [v if v >= 0 else holder_mask(v) for v in col]
    return col


def mask_drops(acc: Sequence[int]) -> list[tuple[int, int]]:
    """The runs of a running AND of holder bitmasks along a block chain: ``(lost, j)`` per
    run, the slots that hold the first ``j`` blocks and not block ``j``. The AND only ever
    loses bits, so each distinct value is one contiguous run, found by bisection (the
    approximate routed-prefix index of the scheduler uses the same rule)."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(acc)
    while i < n:
        v = acc[i]
        if not v:
            break
        j = bisect_left(acc, True, i + 1, n, key=v.__ne__)
        out.append((v ^ acc[j] if j < n else v, j))
        i = j
    return out


def match_chain(
    st: IndexState,
    tenant: str,
    lora: str,
    block_hashes: Sequence[int],
    candidates: Iterable[str] | None = None,
) -> ChainMatch:
    """Longest chain prefix per live instance of ``st`` (see the module doc)."""
    space = st.spaces.get((tenant, lora))
    alive = st.live
    if candidates is not None:
        cmask = 0
        for iid in candidates:
            inst = st.instances.get(iid)
            if inst is not None:
                cmask |= 1 << inst.slot
        alive &= cmask
    if not space or not alive or not block_hashes:
        return NO_MATCH
    tables = (
        sorted((t, d) for t, d in space.items() if d) if len(space) > 1 else list(space.items())
    )
    if not tables or not tables[0][1]:
        return NO_MATCH
    packed = st.next_slot > PACK_FROM
    multi = len(tables) > 1
    cols: list[list[int]] = []
    if not multi and not packed:
        acc = list(accumulate(map(tables[0][1].get, block_hashes, repeat(0)), and_, initial=alive))
    elif not multi:
        acc = list(accumulate(_column(tables[0][1], block_hashes, packed), and_, initial=alive))
    else:
        cols = [_column(d, block_hashes, packed) for _, d in tables]
        masks = map(or_, cols[0], cols[1])
        for col in cols[2:]:
            masks = map(or_, masks, col)
        acc = list(accumulate(masks, and_, initial=alive))
    del acc[0]
    owners, memo = st.owners, st.ids_memo
    runs: list[tuple[tuple[str, ...], int]] = []
    drops = mask_drops(acc)  # (slots that drop out after j blocks, j)
    for lost, j in drops:
        ids: tuple[str, ...]
        if lost & (lost - 1) == 0:  # one slot: not worth memoizing
            ids = (owners[lost.bit_length() - 1].instance_id,)
        elif (memoized := memo.get(lost)) is not None:
            ids = memoized
        else:
            found: list[str] = []
            add, rest = found.append, lost
            while rest:
                low = rest & -rest
                add(owners[low.bit_length() - 1].instance_id)
                rest ^= low
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            ids = memo[lost] = tuple(found)
        runs.append((ids, j))
    if not runs:
        return NO_MATCH
    if not multi:
        return ChainMatch(tuple(runs), tables[0][0])
    slots: dict[int, int] = {}  # slot -> matched blocks
    for lost, j in drops:
        while lost:
            low = lost & -lost
            slots[low.bit_length() - 1] = j
            lost ^= low
    top = runs[-1][1]
    planes = {t: _count_bits([m & a for m, a in zip(col[:top], acc, strict=False)])
              for (t, _), col in zip(tables, cols, strict=True)}  # fmt: skip
    tiers: dict[str, dict[int, int]] = {}
    for s in slots:
        per: dict[int, int] = {}
        for t, pl in planes.items():
            c = sum(((p >> s) & 1) << b for b, p in enumerate(pl))
            if c:
                per[t] = c
        tiers[owners[s].instance_id] = per
    return ChainMatch(tuple(runs), 0, tiers)


def _count_bits(masks: Sequence[int]) -> list[int]:
    """Per-slot counts of set bits over ``masks``, bit-sliced: plane ``b`` holds bit ``b``
    of every slot's count."""
    planes: list[int] = []
    for m in masks:
        carry = m
        for k, p in enumerate(planes):
            planes[k] = p ^ carry
            carry &= p
            if not carry:
                break
        else:
            if carry:
                planes.append(carry)
    return planes
