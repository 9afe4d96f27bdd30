"""What a ``kvcache`` instance's disk segment holds, and what to do with it after a restart
(pure: no I/O, no clock).

kvmeta's object master places every block (as in the DRAM segment) and may evict blocks of
the disk segment to make room without telling the instance. So the index follows two rules:

* a block put at ``[offset, offset + size)`` replaces every held block whose bytes overlap
  that range (kvmeta only hands out free space, so an overlapped block was evicted or
  removed), and a block put again under the same key replaces its older copy;
* a restart reconciles the index with kvmeta (:func:`reconcile`): a block whose bytes fail
  their checksum is dropped; a block kvmeta still lists is kept as it is; the others are put
  again when kvmeta has forgotten the segment's objects (it lists none of the held blocks:
  it restarted without its store, or the segment had to be mounted anew), else dropped
  (kvmeta evicted or removed them while the instance was down, or their put never ended).

The same rules replayed over the same log give the same index (:meth:`DiskIndex.apply`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["DiskBlock", "DiskIndex", "Drop", "Put", "Reconciled", "Record", "reconcile"]


@dataclass(frozen=True)
class DiskBlock:
    """One block on disk: ``offset`` in the segment, ``crc`` = CRC-32 of its ``size`` bytes."""

    tenant: str
    key: str
    offset: int
    size: int
    crc: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class Put:
    """Log record: ``block`` is on disk (written, flushed) and is being committed in kvmeta."""

    block: DiskBlock


@dataclass(frozen=True)
class Drop:
    """Log record: the block of (tenant, key) is no longer held."""

    tenant: str
    key: str


Record = Put | Drop


class DiskIndex:
    """Blocks by (tenant, key), and by offset (sorted) to find the ones a put overlaps."""

    def __init__(self, blocks: Iterable[DiskBlock] = ()) -> None:
        self._by_key: dict[tuple[str, str], DiskBlock] = {}
        self._offsets: list[int] = []  # sorted start offsets of held blocks
        self._at: dict[int, DiskBlock] = {}
        for b in blocks:
            self.put(b)

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, tenant: str, key: str) -> DiskBlock | None:
        return self._by_key.get((tenant, key))

    def blocks(self) -> list[DiskBlock]:
        """Held blocks in offset order."""
        return [self._at[o] for o in self._offsets]

    def used(self) -> int:
        return sum(b.size for b in self._by_key.values())

    def put(self, block: DiskBlock) -> list[DiskBlock]:
        """Hold ``block``; returns the blocks it replaced (same key, or overlapping bytes)."""
        if block.size <= 0 or block.offset < 0:
            raise ValueError(f"bad block range: offset {block.offset}, size {block.size}")
        gone: list[DiskBlock] = []
        old = self._by_key.get((block.tenant, block.key))
        if old is not None:
            self._remove(old)
            gone.append(old)
        # Held blocks never overlap each other, so those overlapping ``block`` are the one
        # starting before it (if it reaches into it) and those starting inside it.
        i = bisect.bisect_left(self._offsets, block.offset)
        if i > 0 and self._at[self._offsets[i - 1]].end > block.offset:
            i -= 1
        while i < len(self._offsets) and self._offsets[i] < block.end:
            victim = self._at[self._offsets[i]]
            self._remove(victim)
            gone.append(victim)
        self._by_key[(block.tenant, block.key)] = block
        bisect.insort(self._offsets, block.offset)
        self._at[block.offset] = block
        return gone

    def drop(self, tenant: str, key: str) -> DiskBlock | None:
        old = self._by_key.get((tenant, key))
        if old is not None:
            self._remove(old)
        return old

    def apply(self, record: Record) -> None:
        """Replay one log record."""
        if isinstance(record, Put):
            self.put(record.block)
        else:
            self.drop(record.tenant, record.key)

    def _remove(self, block: DiskBlock) -> None:
        del self._by_key[(block.tenant, block.key)]
        del self._at[block.offset]
        i = bisect.bisect_left(self._offsets, block.offset)
        del self._offsets[i]


@dataclass(frozen=True)
class Reconciled:
    """What a restart does with each held block."""

    keep: list[DiskBlock]  # kvmeta lists it: served as it is
    reput: list[DiskBlock]  # kvmeta forgot it: put again (kvmeta may place it elsewhere)
    drop: list[DiskBlock]  # bad checksum, or kvmeta evicted / removed it


def reconcile(
    held: Sequence[DiskBlock], intact: Sequence[bool], listed: Sequence[bool]
) -> Reconciled:
    """``intact[i]``: ``held[i]``'s bytes match its checksum; ``listed[i]``: kvmeta lists it
    as committed. kvmeta kept the segment's objects iff it lists any intact held block."""
    if not len(held) == len(intact) == len(listed):
        raise ValueError("held, intact and listed differ in length")
    kept_by_kvmeta = any(i and li for i, li in zip(intact, listed, strict=True))
    keep: list[DiskBlock] = []
    reput: list[DiskBlock] = []
    drop: list[DiskBlock] = []
    for block, ok, there in zip(held, intact, listed, strict=True):
        if not ok:
            drop.append(block)
        elif there:
            keep.append(block)
        elif kept_by_kvmeta:
            drop.append(block)
        else:
            reput.append(block)
    return Reconciled(keep, reput, drop)
