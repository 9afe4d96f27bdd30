"""Slots and holder values: the index's storage, shared by every index built on it.

- Each instance of an index owns a *slot* (a small int below ``MAX_SLOTS``).
- Per (tenant, lora) namespace and tier one ``dict`` maps a block hash to a *holder value*
  naming the slots that hold the block, as compactly as Python allows while staying
  AND-able in C: a single slot ``s`` is the shared int object ``1 << s`` (:func:`slot_bit`);
  two slots whose higher one is below ``PACK_FROM`` and any three or more are the plain
  bitmask; a pair with a slot ``>= PACK_FROM`` (whose bitmask would be a large int) is a
  packed negative int ``<= -PAIR_BASE``. :func:`holder_mask` decodes any holder value,
  :func:`holder_from_mask` encodes a mask canonically.
- Forgetting a whole instance (drop, new epoch, ALL_CLEARED) is O(1): its slot is *retired*
  (out of the live mask at once) and :func:`compact` scrubs its bits from every table later
  and frees the slot for reuse.

Pure: no I/O, no clock. Not thread-safe: one owner mutates an :class:`IndexState`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.kvindex.sequencer import SeqState

__all__ = [
    "MAX_SLOTS",
    "PACK_FROM",
    "PAIR_BASE",
    "IndexState",
    "InstState",
    "alloc_slot",
    "compact",
    "holder_from_mask",
    "holder_mask",
    "new_instance",
    "reset_instance",
    "retire_slot",
    "slot_bit",
    "table",
]

MAX_SLOTS = 1 << 16
PAIR_BASE = 1 << 17  # packed pairs are -(PAIR_BASE + (lo << 16 | hi))
PACK_FROM = 64  # a pair is packed iff its higher slot is >= this (its bitmask needs 3+ digits)

_BITS: list[int] = [1 << s for s in range(256)]


def slot_bit(slot: int) -> int:
    """Holder value of the single slot ``slot``: ``1 << slot``, one shared object per slot."""
    while slot >= len(_BITS):
        _BITS.extend(1 << s for s in range(len(_BITS), len(_BITS) * 2))
    return _BITS[slot]


def holder_mask(v: int) -> int:
    """Bitmask of the slots named by holder value ``v``."""
    if v >= 0:
        return v
    p = -v - PAIR_BASE
    return (1 << (p >> 16)) | (1 << (p & 0xFFFF))


def holder_from_mask(m: int) -> int | None:
    """Canonical holder value of mask ``m`` (None if empty)."""
    if m == 0:
        return None
    low = m & -m
    rest = m ^ low
    if rest == 0:
        return slot_bit(low.bit_length() - 1)
    if rest & (rest - 1) == 0 and rest.bit_length() > PACK_FROM:
        return -(PAIR_BASE + ((low.bit_length() - 1) << 16 | (rest.bit_length() - 1)))
    return m


class InstState:
    """Bookkeeping of one instance: its slot, sequencing, block count, last sign of life."""

    __slots__ = ("blocks", "instance_id", "last_seen", "seq", "slot")

    def __init__(
        self, instance_id: str, slot: int, seq: SeqState, last_seen: float = 0.0, blocks: int = 0
    ) -> None:
        self.instance_id = instance_id
        self.slot = slot
        self.seq = seq
        self.last_seen = last_seen
        self.blocks = blocks  # (block, tier, namespace) entries held

    def __repr__(self) -> str:
        return (
            f"InstState({self.instance_id!r}, slot={self.slot}, {self.seq}, blocks={self.blocks})"
        )


@dataclass
class IndexState:
    """One index (one deployment): its instances, slot owners and block tables."""

    instances: dict[str, InstState] = field(default_factory=dict)
    owners: dict[int, InstState] = field(default_factory=dict)  # slot -> instance (not retired)
    # (tenant, lora) -> tier -> {block_hash: holder value}
    spaces: dict[tuple[str, str], dict[int, dict[int, int]]] = field(default_factory=dict)
    live: int = 0  # slots owned by non-stale instances
    retired: int = 0  # slots whose bits still need scrubbing
    free: list[int] = field(default_factory=list)
    next_slot: int = 0
    # slot mask -> its owners' ids in slot order (a memo of the match; emptied when owners change)
    ids_memo: dict[int, tuple[str, ...]] = field(default_factory=dict)


def table(st: IndexState, tenant: str, lora: str, tier: int) -> dict[int, int]:
    """The ``{block_hash: holder value}`` table of (tenant, lora, tier), created if missing."""
    space = st.spaces.get((tenant, lora))
    if space is None:
        space = st.spaces[(tenant, lora)] = {}
    d = space.get(tier)
    if d is None:
        d = space[tier] = {}
    return d


def alloc_slot(st: IndexState) -> int:
    """A free slot (a compacted one first). Raises OverflowError past ``MAX_SLOTS``."""
    if st.free:
        return st.free.pop()
    if st.next_slot >= MAX_SLOTS:
        raise OverflowError("too many instance slots in one index; call compact()")
    st.next_slot += 1
    return st.next_slot - 1


def new_instance(st: IndexState, instance_id: str, seq: SeqState) -> InstState:
    """Register a new instance on a fresh slot (not live: the caller decides)."""
    inst = InstState(instance_id, alloc_slot(st), seq)
    st.instances[instance_id] = inst
    st.owners[inst.slot] = inst
    st.ids_memo.clear()
    return inst


def retire_slot(st: IndexState, slot: int) -> None:
    """Exclude ``slot`` from matches now; its bits are scrubbed by :func:`compact`."""
    st.owners.pop(slot, None)
    st.live &= ~(1 << slot)
    st.retired |= 1 << slot
    st.ids_memo.clear()


def reset_instance(st: IndexState, inst: InstState) -> None:
    """Forget every block of ``inst`` in O(1): retire its slot, give it a fresh one (not
    live: the caller decides)."""
    retire_slot(st, inst.slot)
    inst.slot = alloc_slot(st)
    inst.blocks = 0
    st.owners[inst.slot] = inst
    st.ids_memo.clear()


def compact(st: IndexState) -> int:
    """Scrub retired slots' bits from every table and free those slots.

    O(entries) when slots are retired, else O(1); returns the entries rewritten or deleted.
    """
    dead = st.retired
    if not dead:
        return 0
    keep = ~dead
    changed = 0
    for space in st.spaces.values():
        for d in space.values():
            drop: list[int] = []
            for h, v in d.items():
                m = v if v >= 0 else holder_mask(v)
                if m & dead:
                    nv = holder_from_mask(m & keep)
                    if nv is None:
                        drop.append(h)
                    else:
                        d[h] = nv
                    changed += 1
            for h in drop:
                del d[h]
    st.free.extend(s for s in range(dead.bit_length() - 1, -1, -1) if dead >> s & 1)
    st.retired = 0
    return changed
