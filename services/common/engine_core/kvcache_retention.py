"""The KV cache's retention and tier operations (:class:`RetentionOps`, a part of
:class:`~services.common.engine_core.kvcache.KVCache`): blocks protected from eviction,
evicted on demand, slots reserved for a prefetch and adopted when its blocks arrive, and
held evicted slots freed once the tier has them. The block store they act on is the
cache's own (:class:`_Cache` names what they use of it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Protocol

from services.common.dataplane.blocks import SlotPool

__all__ = ["RetentionOps"]


class _Cache(Protocol):
    _blocks: dict[int, int]
    _refs: list[int]
    _lru: dict[int, None]
    _held: OrderedDict[int, int]
    _slots: SlotPool
    _protected: set[int]
    _reserved: int
    hold_evicted: bool

    @property
    def free_blocks(self) -> int: ...

    def _remove(self, victims: list[int]) -> None: ...

    def _flush_run(self, run: list[int], parent: int, tenant: str) -> None: ...

    def _place(self, h: int, slot: int, parent: int, tenant: str, refs: int) -> None: ...


class RetentionOps:
    """Retention and tier operations of the KV cache (module doc)."""

    def offloaded(self: _Cache, pairs: list[tuple[int, int]]) -> None:
        """Free the held slots of evicted ``pairs`` (stored in the tier, or given up); pairs
        not held (freed already) are skipped."""
        done = [s for h, s in pairs if self._held.get(s) == h]
        for s in done:
            del self._held[s]
        self._slots.give(done)

    def protect(self: _Cache, hashes: list[int]) -> int:
        """Evict these blocks last (those resident now); returns how many were marked."""
        marked = [h for h in hashes if h in self._blocks]
        self._protected.update(marked)
        return len(marked)

    def unprotect(self: _Cache, hashes: list[int] | None = None) -> None:
        """Drop the mark of ``hashes`` (None: of every block)."""
        if hashes is None:
            self._protected.clear()
        else:
            self._protected.difference_update(hashes)

    def evict_now(self: _Cache, hashes: list[int]) -> int:
        """Evict these blocks now (an idle session's prefix the retention rule offloads),
        those resident and unreferenced, in the order given: to the tier with
        ``hold_evicted`` (as an eviction under pressure would), else freed. Returns how many
        were evicted."""
        seen: set[int] = set()
        victims = []
        for h in hashes:
            slot = self._blocks.get(h)
            if slot is not None and self._refs[slot] == 0 and h not in seen:
                seen.add(h)
                victims.append(h)
        self._remove(victims)
        return len(victims)

    @property
    def protected_blocks(self: _Cache) -> int:
        """Resident blocks marked by :meth:`protect`."""
        return len(self._protected)

    def count_protected(self: _Cache, hashes: Iterable[int]) -> int:
        """How many of ``hashes`` are resident and protected."""
        prot = self._protected
        return sum(1 for h in hashes if h in prot)

    @property
    def reserved_blocks(self: _Cache) -> int:
        """Slots taken by :meth:`reserve` and not yet adopted or given back."""
        return self._reserved

    def reserve(self: _Cache, n: int) -> list[int] | None:
        """``n`` slots for blocks a prefetch brings in, or None (nothing taken). Room is
        made by evicting unprotected unreferenced blocks (LRU), never protected ones; with
        ``hold_evicted`` their slots come back only with :meth:`offloaded` (retry then)."""
        if n < 0:
            raise ValueError("n must be >= 0")
        short = n - self.free_blocks
        if short > 0:
            # held slots come back when their stores end: evict only what they do not cover
            need = short - len(self._held) if self.hold_evicted else short
            free = (h for h in self._lru if h not in self._protected)
            victims = list(islice(free, max(0, need)))
            if len(victims) < need:
                return None  # not even evicting every unprotected block would do
            self._remove(victims)
            if n > self.free_blocks:
                return None
        slots = self._slots.take(n)
        assert slots is not None  # used blocks never outnumber the slots
        self._reserved += n
        return slots

    def unreserve(self: _Cache, slots: Sequence[int]) -> None:
        """Give back reserved slots a prefetch did not fill."""
        self._slots.give(slots)
        self._reserved -= len(slots)

    def adopt(self: _Cache, pairs: Sequence[tuple[int, int]], parent: int, tenant: str = "") -> int:
        """Reserved slots now hold verified blocks ``(hash, slot)`` (a chain, parent first;
        ``parent``: the first one's parent, 0 at the start of a sequence). They become
        cached blocks: unreferenced, most recent in LRU order (leaf first, as a released
        chain), protected, announced by one STORED event per run. A hash that became
        resident meanwhile (a request computed it) keeps its block; that slot is given
        back. Returns how many blocks were added."""
        run: list[int] = []
        run_parent = parent
        added: list[int] = []
        spare: list[int] = []
        prev = parent
        for h, slot in pairs:
            if h in self._blocks:
                spare.append(slot)
                self._flush_run(run, run_parent, tenant)
                run = []
            else:
                self._place(h, slot, prev, tenant, 0)
                if not run:
                    run_parent = prev
                run.append(h)
                added.append(h)
            prev = h
        self._flush_run(run, run_parent, tenant)
        for h in reversed(added):
            self._lru[h] = None
        self._protected.update(added)
        self._reserved -= len(pairs)
        self._slots.give(spare)
        return len(added)
