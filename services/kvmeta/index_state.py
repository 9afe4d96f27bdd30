"""State of the prefix index: holder encoding and per-deployment slot bookkeeping.

Internal to :mod:`services.kvmeta.index` and its snapshot codec
(:mod:`services.kvmeta.index_codec`); other code uses ``PrefixIndex``.

- Each instance of a deployment owns a *slot* (a small int, below ``MAX_SLOTS``).
- A *holder value* names the slots that hold one block, as compactly as Python allows:
  ``~s`` (a negative int, shared object from ``slot_holder``) for a single slot ``s``; a packed
  negative int ``<= -PAIR_BASE`` for exactly two slots; a positive int bitmask for more.
- Dropping an instance *retires* its slot (excluded from the live mask at once); ``compact``
  scrubs retired bits from every table later and frees the slots for reuse.

No I/O, no clock. Not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "MAX_SLOTS",
    "PAIR_BASE",
    "DepState",
    "InstState",
    "alloc_slot",
    "compact",
    "holder_from_mask",
    "holder_mask",
    "new_instance",
    "reset_instance",
    "retire_slot",
    "slot_holder",
    "table",
]

MAX_SLOTS = 1 << 16
PAIR_BASE = 1 << 17  # pair values are -(PAIR_BASE + (lo << 16 | hi)); singles are ~s >= -2**16

_NEG: list[int] = [~s for s in range(1024)]


def slot_holder(slot: int) -> int:
    """Holder value of the single slot ``slot`` (``~slot``, one shared int object per slot)."""
    while slot >= len(_NEG):
        _NEG.extend(~s for s in range(len(_NEG), len(_NEG) * 2))
    return _NEG[slot]


def holder_mask(v: int) -> int:
    """Bitmask of slots named by holder value ``v``."""
    if v >= 0:
        return v
    if v > -PAIR_BASE:
        return 1 << ~v
    p = -v - PAIR_BASE
    return (1 << (p >> 16)) | (1 << (p & 0xFFFF))


def holder_from_mask(m: int) -> int | None:
    """Most compact holder value for mask ``m`` (None if empty)."""
    if m == 0:
        return None
    low = m & -m
    rest = m ^ low
    if rest == 0:
        return slot_holder(low.bit_length() - 1)
    if rest & (rest - 1) == 0:
        return -(PAIR_BASE + ((low.bit_length() - 1) << 16 | (rest.bit_length() - 1)))
    return m


@dataclass
class InstState:
    """Sequencing and bookkeeping of one instance in one deployment."""

    instance_id: str
    slot: int
    epoch: int
    last_seq: int = 0
    stale: bool = False
    last_seen: float = 0.0
    blocks: int = 0
    syncing: bool = False  # inside a multi-batch full state (stale until its last batch)


@dataclass
class DepState:
    """One deployment: its instances, slot owners and block tables."""

    instances: dict[str, InstState] = field(default_factory=dict)
    owners: dict[int, InstState] = field(default_factory=dict)
    # (tenant, lora) -> tier -> {block_hash: holder value}
    spaces: dict[tuple[str, str], dict[int, dict[int, int]]] = field(default_factory=dict)
    live: int = 0  # slots owned by non-stale instances
    retired: int = 0  # slots whose bits still need scrubbing
    free: list[int] = field(default_factory=list)
    next_slot: int = 0


def table(dep: DepState, tenant: str, lora: str, tier: int) -> dict[int, int]:
    """The ``{block_hash: holder value}`` table of (tenant, lora, tier), created if missing."""
    space = dep.spaces.get((tenant, lora))
    if space is None:
        space = dep.spaces[(tenant, lora)] = {}
    d = space.get(tier)
    if d is None:
        d = space[tier] = {}
    return d


def alloc_slot(dep: DepState) -> int:
    """A free slot (a compacted one first). Raises OverflowError past ``MAX_SLOTS``."""
    if dep.free:
        return dep.free.pop()
    if dep.next_slot >= MAX_SLOTS:
        raise OverflowError("too many instance slots in one deployment; call compact()")
    dep.next_slot += 1
    return dep.next_slot - 1


def new_instance(dep: DepState, instance_id: str, epoch: int) -> InstState:
    """Register a new, live instance on a fresh slot."""
    inst = InstState(instance_id, alloc_slot(dep), epoch)
    dep.instances[instance_id] = inst
    dep.owners[inst.slot] = inst
    dep.live |= 1 << inst.slot
    return inst


def retire_slot(dep: DepState, slot: int) -> None:
    """Exclude ``slot`` from matches now; its bits are scrubbed by ``compact``."""
    dep.owners.pop(slot, None)
    dep.live &= ~(1 << slot)
    dep.retired |= 1 << slot


def reset_instance(dep: DepState, inst: InstState) -> None:
    """Forget every block of ``inst`` in O(1): retire its slot, give it a fresh one.

    The new slot is not live; the caller decides (the instance may be stale).
    """
    retire_slot(dep, inst.slot)
    inst.slot = alloc_slot(dep)
    inst.blocks = 0
    dep.owners[inst.slot] = inst


def compact(dep: DepState) -> int:
    """Scrub retired slots' bits from every table of ``dep`` and free those slots.

    O(entries) when slots are retired, else O(1); returns the entries rewritten or deleted.
    """
    dead = dep.retired
    if not dead:
        return 0
    changed = 0
    for space in dep.spaces.values():
        for d in space.values():
            drop: list[int] = []
            for h, v in d.items():
                m = holder_mask(v)
                if m & dead:
                    nv = holder_from_mask(m & ~dead)
                    if nv is None:
                        drop.append(h)
                    else:
                        d[h] = nv
                    changed += 1
            for h in drop:
                del d[h]
    slots = [s for s in range(dead.bit_length()) if dead >> s & 1]
    dep.free.extend(sorted(slots, reverse=True))
    dep.retired = 0
    return changed
