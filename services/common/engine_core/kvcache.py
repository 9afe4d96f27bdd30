"""Paged KV cache with prefix reuse by chained block hashes (pure, no I/O).

Capacity is counted in blocks of ``block_size`` tokens. A sequence reserves, at admission,
every block it can ever need (prompt + max new tokens): matched prefix blocks are *shared*
(reference counted), the rest are *private*. When its prompt has been computed, the sequence
``commit``s the full prompt blocks: private blocks become cached blocks keyed by their chained
hash (``services.common.tokens.block_hashes``; a block's hash covers its whole prefix, the
tenant salt seeds the chain). ``release`` drops the references; a cached block with no
reference stays resident and is reused by later prompts until it is evicted.

Eviction is LRU over unreferenced cached blocks only, leaf first (a released chain is queued
child before parent, so a prefix outlives its extensions). Referenced blocks are never evicted.
Retention priority: blocks marked with :meth:`KVCache.protect` (an idle agent session's
prefix the retention rule keeps, :mod:`services.common.sessions.retention`) are evicted only
when the unprotected ones are not enough, then in LRU order too; :meth:`KVCache.unprotect`
drops the mark. Protection never refuses an allocation that would fit without it.
:meth:`KVCache.evict_now` evicts named blocks at once (the retention rule's offload).

Prefetch (blocks brought back from the KV-cache tier ahead of a request): :meth:`reserve`
takes slots for them (counted as used), the shell reads the bytes into those slots, and
:meth:`adopt` makes them cached blocks like committed ones (unreferenced, protected,
announced by a STORED event), or :meth:`unreserve` gives the slots back.

Every cached block has a *slot* in ``0 .. capacity_blocks-1`` (taken at commit, given back
when the block is evicted or cleared; cached blocks never outnumber the capacity, so one is
always free): where its bytes live when the engine holds real KV bytes
(:mod:`services.engine.kvbytes`). ``drain_filled`` lists the (hash, slot) pairs committed
since the last call, whose bytes the shell writes.

Offload on eviction (``hold_evicted=True``, an engine whose tier policy is
``offload_on_evict``): an evicted block's slot is *held* with its bytes instead of freed
(``drain_evicted`` lists the (hash, slot) pairs evicted since the last call, for the shell to
store in the KV-cache tier) and counts as used until ``offloaded`` frees it, as a GPU block
is not reused before its copy to host memory is done. So an allocation that needs more than
the free blocks evicts what it needs (starting those offloads) and is refused (None) until
they are freed; it evicts nothing when it could not fit even then.

Every residency change is appended to ``outbox`` as a :class:`KVEventRecord` (stored /
removed / all-cleared); the shell drains it with :meth:`KVCache.drain_events` and publishes it
(a cache made with ``record=False`` keeps neither events nor filled slots: its owner reads
neither).
:meth:`KVCache.full_state` describes the whole resident set the same way (the answer to a
resync request): drained events followed by the full state reproduce the cache exactly.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import compress, islice, repeat, takewhile
from operator import not_, sub
from typing import cast

from services.common.dataplane.blocks import SlotPool
from services.common.engine_core.kvcache_retention import RetentionOps
from services.common.engine_core.kvcache_state import full_state
from services.common.engine_core.kvcache_types import Allocation, KVEventKind, KVEventRecord, _Block

__all__ = ["Allocation", "KVCache", "KVEventKind", "KVEventRecord"]


class KVCache(RetentionOps):
    """Block accounting + prefix index. Not thread-safe; the engine core owns one."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        *,
        hold_evicted: bool = False,
        running_blocks: int | None = None,
        record: bool = True,
    ) -> None:
        """``running_blocks``: at most this many blocks referenced by sequences at once (None:
        the capacity): a cache bigger than the batch it serves, e.g. a simulation's reference
        that differs from another run only in what it can keep cached. ``record=False``: no
        KV events and no filled slots are kept (``drain_events`` and ``drain_filled`` answer
        ``[]``), for an owner that reads neither (the discrete-event simulator)."""
        if capacity_blocks <= 0 or block_size <= 0:
            raise ValueError("capacity_blocks and block_size must be positive")
        if running_blocks is not None and not 0 < running_blocks <= capacity_blocks:
            raise ValueError("running_blocks must be in [1, capacity_blocks]")
        self.capacity_blocks = capacity_blocks
        self.running_blocks = running_blocks or capacity_blocks
        self.block_size = block_size
        # A cached block is its slot (hash -> slot) and, per slot, its parent hash, tenant
        # and reference count: lists indexed by slot (grown to the highest slot taken), not
        # an object per block (a simulated fleet holds millions of blocks).
        self._blocks: dict[int, int] = {}
        self._parent: list[int] = []
        self._tenant: list[str] = []
        self._refs: list[int] = []
        # Unreferenced cached blocks, oldest first: a plain dict (insertion-ordered; a block
        # leaves it when referenced again or evicted, and comes back at the end). Cheaper than
        # an OrderedDict to append a released sequence's blocks to, and no node per block.
        self._lru: dict[int, None] = {}
        self._private = 0
        self._seqs: dict[str, Allocation] = {}
        self.outbox: list[KVEventRecord] = []
        self.record = record
        self._slots = SlotPool(capacity_blocks)
        self._filled: list[tuple[int, int]] = []
        self.hold_evicted = hold_evicted
        self._held: OrderedDict[int, int] = OrderedDict()  # slot -> evicted hash, oldest first
        self._evicted: list[tuple[int, int]] = []
        self._protected: set[int] = set()
        self._reserved = 0  # slots taken for blocks a prefetch is bringing in
        # Cumulative prefix-cache statistics (in tokens of full blocks).
        self.query_tokens = 0
        self.hit_tokens = 0

    # -- queries -------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks holding data (private + cached, evictable or not, + evicted and held +
        reserved for a prefetch)."""
        return self._private + len(self._blocks) + len(self._held) + self._reserved

    @property
    def referenced_blocks(self) -> int:
        """Blocks that cannot be evicted now."""
        return self._private + len(self._blocks) - len(self._lru) + self._reserved

    @property
    def free_blocks(self) -> int:
        return self.capacity_blocks - self.used_blocks

    @property
    def usage(self) -> float:
        """Fraction of capacity held by running sequences, [0, 1] (cached-but-idle excluded)."""
        return self.referenced_blocks / self.capacity_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-max(0, tokens) // self.block_size)

    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading ``hashes`` resident now (no side effects)."""
        return len(list(takewhile(self._blocks.__contains__, hashes)))  # in C

    def slot_of(self, h: int) -> int | None:
        """The slot of a resident cached block (None if not resident)."""
        return self._blocks.get(h)

    def drain_filled(self) -> list[tuple[int, int]]:
        """(hash, slot) of the blocks committed since the last call, in commit order."""
        out, self._filled = self._filled, []
        return out

    def drain_evicted(self) -> list[tuple[int, int]]:
        """(hash, slot) of the blocks evicted (and held) since the last call, oldest first."""
        out, self._evicted = self._evicted, []
        return out

    @property
    def held_slots(self) -> int:
        return len(self._held)

    def holds(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    # -- mutations -----------------------------------------------------------------------
    def allocate(
        self, seq_id: str, hashes: list[int], total_blocks: int, tenant: str = ""
    ) -> Allocation | None:
        """Reserve ``total_blocks`` for a sequence whose full prompt blocks hash to ``hashes``.

        Returns ``None`` (and changes nothing) when the blocks cannot be found even after
        evicting every unreferenced cached block (and freeing every held one). With
        ``hold_evicted``, also ``None`` while the blocks it evicted (or others) are held: it
        evicts what it needs first, so the retry after ``offloaded`` succeeds. Raises
        ``ValueError`` for a duplicate id.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        matched = self.match(hashes)
        private = max(0, total_blocks - matched)
        # Matched blocks that are unreferenced now stop being evictable.
        # (an unreferenced cached block is exactly one in the LRU order)
        evictable_after = len(self._lru) - sum(map(self._lru.__contains__, hashes[:matched]))
        if private > self.free_blocks + evictable_after + len(self._held):
            return None
        if self._over_running(hashes[:matched], private):
            return None
        if self.hold_evicted and private > self.free_blocks:
            # Evict what the held blocks (freed when stored) do not cover, not the prefix it
            # matches; their offloads start now.
            missing = private - self.free_blocks - len(self._held)
            self._evict(missing, keep=set(hashes[:matched]))
            if private > self.free_blocks:
                return None
        shared = hashes[:matched]
        blocks, refs, lru = self._blocks, self._refs, self._lru  # _ref per block, inlined
        for h in shared:
            slot = blocks[h]
            if refs[slot] == 0:
                lru.pop(h, None)
            refs[slot] += 1
        self._evict(private - self.free_blocks)
        self._private += private
        self.query_tokens += len(hashes) * self.block_size
        self.hit_tokens += matched * self.block_size
        alloc = Allocation(seq_id, list(shared), private, matched, tenant)
        self._seqs[seq_id] = alloc
        return alloc

    def fits(self, hashes: list[int], total_blocks: int) -> bool | None:
        """Whether ``allocate(_, hashes, total_blocks)`` would succeed now, without changing
        anything; None when that cannot be told without trying (``hold_evicted``)."""
        if self.hold_evicted:
            return None
        matched = self.match(hashes)
        private = max(0, total_blocks - matched)
        # (an unreferenced cached block is exactly one in the LRU order)
        evictable_after = len(self._lru) - sum(map(self._lru.__contains__, hashes[:matched]))
        if self._over_running(hashes[:matched], private):
            return False
        return private <= self.free_blocks + evictable_after + len(self._held)

    def _over_running(self, shared: list[int], private: int) -> bool:
        """Whether a sequence sharing ``shared`` and adding ``private`` blocks would take the
        blocks referenced by sequences past ``running_blocks``."""
        if self.running_blocks >= self.capacity_blocks:
            return False
        newly = sum(map(self._lru.__contains__, shared))
        held = self._private + len(self._blocks) - len(self._lru)
        return held + newly + private > self.running_blocks

    def commit(self, seq_id: str, hashes: list[int]) -> None:
        """The prompt of ``seq_id`` is computed: its full blocks ``hashes`` become cached.

        Blocks already shared are skipped; a hash another sequence committed meanwhile is not
        duplicated (this sequence's copy stays private). Emits one STORED event per run of
        new blocks. Idempotent per hash.
        """
        alloc = self._seqs[seq_id]
        start = len(alloc.shared) + len(alloc.committed)
        tail = hashes[start:]
        if (
            0 < len(tail) <= alloc.private
            and not any(map(self._blocks.__contains__, tail))
            and len(set(tail)) == len(tail)
        ):  # none resident (the common case): one run, in bulk
            taken = self._slots.take(len(tail))
            assert taken is not None  # cached + held blocks never outnumber the slots
            self._commit_run(alloc, hashes, start, taken)
            return
        # The slots of the blocks the loop below adds, taken at once (the same slots, in the
        # same order, as one at a time): the hashes not resident, while private blocks last.
        fresh: set[int] = set()
        for h in hashes[start:]:
            if len(fresh) >= alloc.private:
                break
            if h not in self._blocks:
                fresh.add(h)
        taken = self._slots.take(len(fresh))
        assert taken is not None  # cached + held blocks never outnumber the slots
        self._grow(taken)
        slots = iter(taken)
        run: list[int] = []
        run_parent = 0
        # Locals in the per-block loop (a long prompt has hundreds of blocks); the private
        # count is written back once, after it.
        blocks, committed, tenant = self._blocks, alloc.committed, alloc.tenant
        filled = self._filled if self.record else None
        parents, tenants, refs = self._parent, self._tenant, self._refs
        private = alloc.private
        for i in range(start, len(hashes)):
            h = hashes[i]
            if h in blocks or private == 0:
                if run:
                    self._flush_run(run, run_parent, tenant)
                    run = []
                continue
            parent = hashes[i - 1] if i else 0
            slot = next(slots)
            blocks[h] = slot
            parents[slot], tenants[slot], refs[slot] = parent, tenant, 1
            if filled is not None:
                filled.append((h, slot))
            private -= 1
            committed.append(h)
            if not run:
                run_parent = parent
            run.append(h)
        self._flush_run(run, run_parent, tenant)
        self._private -= alloc.private - private
        alloc.private = private

    def _commit_run(
        self, alloc: Allocation, hashes: list[int], start: int, slots: list[int]
    ) -> None:
        """:meth:`commit`'s loop when every block from ``start`` on is new and has a
        private block (``slots``, one each): the same blocks, slots, lists and one event."""
        new = hashes[start:]
        parent = hashes[start - 1] if start else 0
        tenant = alloc.tenant
        self._grow(slots)
        par, ten, refs = self._parent, self._tenant, self._refs
        a, n = slots[0], len(slots)
        if slots[-1] - a == n - 1 and slots == list(range(a, a + n)):  # consecutive: slices
            par[a : a + n] = (parent, *new[:-1])
            ten[a : a + n] = repeat(tenant, n)
            refs[a : a + n] = repeat(1, n)
        else:
            for slot, p in zip(slots, (parent, *new[:-1]), strict=True):
                par[slot] = p
                ten[slot] = tenant
                refs[slot] = 1
        self._blocks.update(zip(new, slots, strict=True))
        if self.record:
            self._filled.extend(zip(new, slots, strict=True))
        alloc.committed.extend(new)
        self._flush_run(new, parent, tenant)
        self._private -= len(new)
        alloc.private -= len(new)

    def release(self, seq_id: str) -> None:
        """Drop everything ``seq_id`` holds (no-op if it holds nothing). Its cached blocks stay
        resident, unreferenced, most recent and leaf-first in the LRU order."""
        alloc = self._seqs.pop(seq_id, None)
        if alloc is None:
            return
        self._private -= alloc.private
        refs = self._refs
        held = alloc.shared + alloc.committed
        held.reverse()
        found = list(map(self._blocks.get, held))
        if None not in found and len(set(found)) == len(found):  # the usual case, in C
            slots = cast("list[int]", found)
            lefts = list(map(sub, map(refs.__getitem__, slots), repeat(1)))
            deque(map(refs.__setitem__, slots, lefts), maxlen=0)
            # unreferenced now, leaf first: they go last in the LRU order
            self._lru.update(dict.fromkeys(compress(held, map(not_, lefts))))
            return
        freed: list[int] = []  # the same, block by block
        for h, slot in zip(held, found, strict=True):
            if slot is None:
                continue
            left = refs[slot] - 1
            refs[slot] = left
            if left == 0:
                freed.append(h)
        self._lru.update(dict.fromkeys(freed))  # none of them is in it while referenced

    def clear(self) -> bool:
        """Drop every unreferenced cached block and emit ALL_CLEARED. Refused (False) while
        any sequence holds blocks, as engines refuse ``flush_cache`` with requests running."""
        if self._seqs:
            return False
        self._slots.give(list(self._blocks.values()))
        self._filled.clear()
        self._blocks.clear()
        self._lru.clear()
        self._protected.clear()
        if self.record:
            self.outbox.append(KVEventRecord(KVEventKind.ALL_CLEARED))
        return True

    def drain_events(self) -> list[KVEventRecord]:
        out, self.outbox = self.outbox, []
        return out

    def resident(self) -> dict[str, set[int]]:
        """Hashes of the cached (indexable) blocks by tenant; private blocks are not included."""
        out: dict[str, set[int]] = {}
        tenants = self._tenant
        for h, slot in self._blocks.items():
            out.setdefault(tenants[slot], set()).add(h)
        return out

    def full_state(self) -> list[KVEventRecord]:
        """The resident set as events (:func:`~services.common.engine_core.kvcache_state.full_state`).
        Pure: the outbox is not touched; take it right after :meth:`drain_events`."""
        par, ten, refs = self._parent, self._tenant, self._refs
        blocks = {h: _Block(par[s], ten[s], s, refs[s]) for h, s in self._blocks.items()}
        return full_state(blocks, self.block_size)

    # -- internals -----------------------------------------------------------------------
    def _flush_run(self, run: list[int], parent: int, tenant: str) -> None:
        if run and self.record:
            self.outbox.append(
                KVEventRecord(
                    KVEventKind.STORED, tuple(run), parent, len(run) * self.block_size, tenant
                )
            )

    def _place(self, h: int, slot: int, parent: int, tenant: str, refs: int) -> None:
        """A cached block: ``h`` in ``slot``."""
        self._grow((slot,))
        self._blocks[h] = slot
        self._parent[slot], self._tenant[slot], self._refs[slot] = parent, tenant, refs

    def _grow(self, slots: Sequence[int]) -> None:
        """The per-slot lists long enough for ``slots``."""
        top = max(slots, default=-1) + 1
        more = top - len(self._refs)
        if more > 0:
            self._parent.extend(repeat(0, more))
            self._tenant.extend(repeat("", more))
            self._refs.extend(repeat(0, more))

    def _evict(self, n: int, keep: set[int] | None = None) -> None:
        """Evict up to ``n`` unreferenced blocks, least recent first, none of ``keep``;
        protected blocks only when the others are not enough."""
        if n <= 0:
            return
        prot = self._protected
        if not keep and not prot:  # every unreferenced block may go: the oldest n, in C
            self._remove(list(islice(self._lru, n)))
            return
        free = (h for h in self._lru if (not keep or h not in keep) and h not in prot)
        victims = list(islice(free, n))
        if len(victims) < n and prot:
            last = (h for h in self._lru if (not keep or h not in keep) and h in prot)
            victims.extend(islice(last, n - len(victims)))
        self._remove(victims)

    def _remove(self, victims: list[int]) -> None:
        """Evict these unreferenced cached blocks (distinct; to the tier when holding
        evicted ones)."""
        if not victims:
            return
        if self.hold_evicted:
            for h in victims:
                del self._lru[h]
                self._protected.discard(h)
                slot = self._blocks.pop(h)
                self._held[slot] = h
                self._evicted.append((h, slot))
        else:  # the same, in bulk
            deque(map(self._lru.__delitem__, victims), maxlen=0)
            if self._protected:
                self._protected.difference_update(victims)
            self._slots.give(list(map(self._blocks.pop, victims)))
        if self.record:
            self.outbox.append(
                KVEventRecord(
                    KVEventKind.REMOVED, tuple(victims), 0, len(victims) * self.block_size
                )
            )
