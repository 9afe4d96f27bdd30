"""The routed-prefix index behind the approximate prefix plugins (pure, deterministic):
which instances were recently sent which block-hash chains. :mod:`.prefix` re-exports
:class:`RoutedPrefixIndex`."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import and_

from services.common.kvindex.match import mask_drops
from services.common.routing.plugins.routed_match import RoutedMatch, Slots

__all__ = ["RoutedPrefixIndex"]


class _Rec:
    """One insert: its time, the instance slot and the indexed hashes (parent first).

    An entry (hash, slot) belongs to the record of the insert that last routed it
    (``table[hash] is rec``); ``live`` counts them. Older records keep stale references
    that are skipped; a record with no live entry is dead (its hashes are let go)."""

    __slots__ = ("cursor", "hashes", "live", "slot", "t")

    def __init__(self, t: float, slot: int, hashes: tuple[int, ...]) -> None:
        self.t = t
        self.slot = slot
        self.hashes = hashes
        self.cursor = 0  # hashes before it were already evicted or expired
        self.live = 0


class RoutedPrefixIndex:
    """Which instances were recently sent which block-hash chains (pure, deterministic).

    Entries are (block hash, instance) with a last-routed time; an entry older than ``ttl_s``
    is ignored and dropped, and beyond ``max_entries`` the least recently routed entries are
    evicted (entries of one insert in chain order). Because a chained hash covers its whole
    prefix, only every ``stride``-th block hash is indexed (positions stride-1, 2*stride-1,
    ...), trading granularity for memory, plus the chain's tip (its last block), so that a
    prompt shorter than ``stride`` blocks, and the exact end of a routed prompt that the next
    turn extends, are known to the block. ``now`` must not go backwards across calls. A
    hash repeated within one chain is indexed once (at its first position).

    Layout: each instance owns a small-int slot; per block hash one int bitmask of the
    slots holding it (a match ANDs the masks along the chain), and per slot a dict block
    hash → the insert record that last routed it. Records form a time-ordered log, so TTL
    expiry and LRU eviction pop from its head, skipping entries a later insert refreshed;
    the log is compacted when stale references outnumber live entries.
    """

    def __init__(self, ttl_s: float, max_entries: int, stride: int = 1) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.stride = stride
        self._masks: dict[int, int] = {}
        self._slot_of: dict[str, int] = {}
        self._iids: list[str] = []
        self._tables: list[dict[int, _Rec] | None] = []
        self._free: list[int] = []
        self._slots: Slots | None = None  # the slots as matches see them (None: changed)
        self._log: deque[_Rec] = deque()
        self._count = 0
        self._logged = 0  # hash references held by live records (from their cursor)
        self._dead = 0  # dead records still in the log

    def __len__(self) -> int:
        return self._count

    # -- internals ------------------------------------------------------------------------
    def _slot(self, instance_id: str) -> int:
        slot = self._slot_of.get(instance_id)
        if slot is None:
            self._slots = None
            if self._free:
                slot = self._free.pop()
                self._iids[slot] = instance_id
                self._tables[slot] = {}
            else:
                slot = len(self._iids)
                self._iids.append(instance_id)
                self._tables.append({})
            self._slot_of[instance_id] = slot
        return slot

    def _release_slot(self, slot: int) -> None:
        self._slots = None
        del self._slot_of[self._iids[slot]]
        self._iids[slot] = ""
        self._tables[slot] = None
        self._free.append(slot)

    def _unmask(self, h: int, bit: int) -> None:
        m = self._masks[h] & ~bit
        if m:
            self._masks[h] = m
        else:
            del self._masks[h]

    def _lose(self, rec: _Rec, n: int) -> None:
        """``n`` live entries of ``rec`` were refreshed or dropped."""
        rec.live -= n
        if rec.live <= 0:
            self._logged -= len(rec.hashes) - rec.cursor
            rec.hashes, rec.cursor = (), 0
            self._dead += 1

    def _pop_head(self, limit: int | None) -> None:
        """Drop the head record's live entries from its cursor on; stop early once
        ``limit`` entries were dropped (LRU eviction), else drop the whole record."""
        rec = self._log[0]
        if rec.live <= 0:
            self._log.popleft()
            self._dead -= 1
            return
        table = self._tables[rec.slot]
        assert table is not None  # a live record's slot is held by its entries
        hashes = rec.hashes
        bit = 1 << rec.slot
        i, n, dropped = rec.cursor, len(hashes), 0
        while i < n and (limit is None or dropped < limit):
            h = hashes[i]
            i += 1
            if table.get(h) is rec:
                del table[h]
                self._unmask(h, bit)
                dropped += 1
        self._count -= dropped
        self._logged -= i - rec.cursor
        rec.cursor = i
        rec.live -= dropped
        if i >= n or rec.live <= 0:
            self._logged -= n - i
            rec.hashes, rec.cursor, rec.live = (), 0, 0
            self._log.popleft()
        if not table:
            self._release_slot(rec.slot)

    def _compact(self) -> None:
        log: deque[_Rec] = deque()
        logged = 0
        for rec in self._log:
            if rec.live <= 0:
                continue
            if rec.live < len(rec.hashes) - rec.cursor:
                get = self._tables[rec.slot].get  # type: ignore[union-attr]
                rec.hashes = tuple(h for h in rec.hashes[rec.cursor :] if get(h) is rec)
                rec.cursor = 0
            log.append(rec)
            logged += len(rec.hashes) - rec.cursor
        self._log, self._logged, self._dead = log, logged, 0

    # -- API ------------------------------------------------------------------------------
    def expire(self, now: float) -> int:
        """Drop entries older than the TTL; returns how many."""
        cutoff = now - self.ttl_s
        before = self._count
        log = self._log
        while log and log[0].t < cutoff:
            self._pop_head(None)
        return before - self._count

    def insert(self, hashes: Sequence[int], instance_id: str, now: float) -> list[tuple[int, str]]:
        """Record that ``hashes`` (a chain, parent first) were routed to ``instance_id``.
        Returns the entries this call created (not those it only refreshed)."""
        self.expire(now)
        stride = self.stride
        hs = tuple(hashes[stride - 1 :: stride] if stride > 1 else hashes)
        if stride > 1 and len(hashes) % stride:
            hs += (hashes[-1],)  # the tip
        if not hs:
            return []
        if len(set(hs)) != len(hs):
            hs = tuple(dict.fromkeys(hs))
        slot = self._slot(instance_id)
        table = self._tables[slot]
        assert table is not None
        rec = _Rec(now, slot, hs)
        # Which records lose entries to this one (None: entries it creates), in C.
        olds: Counter[_Rec | None] = Counter(map(table.get, hs))
        fresh = olds.pop(None, 0)
        for old, k in olds.items():
            if old is not None:
                self._lose(old, k)
        created: list[tuple[int, str]] = []
        if fresh:
            new = hs if fresh == len(hs) else [h for h in hs if h not in table]
            masks, bit = self._masks, 1 << slot
            for h in new:
                masks[h] = masks.get(h, 0) | bit
            created = [(h, instance_id) for h in new]
        table.update(dict.fromkeys(hs, rec))
        rec.live = len(hs)
        self._log.append(rec)
        self._count += fresh
        self._logged += len(hs)
        while self._count > self.max_entries:
            self._pop_head(self._count - self.max_entries)
        if self._logged > 3 * self._count + 65_536 or self._dead > len(self._log) // 2 + 4096:
            self._compact()
        return created

    def retract(self, keys: Sequence[tuple[int, str]], at: float) -> int:
        """Drop entries an insert at time ``at`` created, unless a later insert refreshed
        them (their time is no longer ``at``). Returns how many were dropped."""
        n = 0
        for h, iid in keys:
            slot = self._slot_of.get(iid)
            if slot is None:
                continue
            table = self._tables[slot]
            rec = table.get(h) if table is not None else None
            if table is not None and rec is not None and rec.t == at:
                del table[h]
                self._unmask(h, 1 << slot)
                self._lose(rec, 1)
                n += 1
                if not table:
                    self._release_slot(slot)
        self._count -= n
        return n

    def match(self, hashes: Sequence[int], now: float) -> RoutedMatch:
        """Matched prefix length in blocks per instance (only instances with > 0): a
        mapping built when iterated (:class:`RoutedMatch`; ``get`` reads the masks)."""
        self.expire(now)
        stride = self.stride
        hs = hashes[stride - 1 :: stride] if stride > 1 else hashes
        slots = self._slots
        if slots is None:
            slots = self._slots = Slots(self._iids)
        if not hashes or not self._masks:
            return RoutedMatch([], slots)
        # Running AND of the holder masks along the chain (in C); it only ever loses bits,
        # so each distinct value is one contiguous run, found by bisection.
        acc = list(accumulate(map(self._masks.get, hs, repeat(0)), and_))
        writes = [(lost, j * stride) for lost, j in mask_drops(acc)]
        if stride > 1:
            self._tips(hashes, writes)
        return RoutedMatch(writes, slots)

    def _tips(self, hashes: Sequence[int], writes: list[tuple[int, int]]) -> None:
        """Extend each instance's strided match (``writes``: the slots per match length)
        with a routed tip among the next ``stride - 1`` blocks (the one after them is a
        strided position it did not match): a write per tip found, after them."""
        masks, stride, n = self._masks, self.stride, len(hashes)
        matched = 0
        for bits, _ in writes:
            matched |= bits
        groups = [(k, bits) for bits, k in writes]
        groups.append((0, ~matched))  # instances with no strided match
        for k, bits in groups:
            for p in range(k, min(k + stride - 1, n)):
                found = masks.get(hashes[p], 0) & bits
                if found:
                    writes.append((found, p + 1))

    def remove_instance(self, instance_id: str) -> int:
        """Forget an instance (left the fleet or restarted with an empty cache)."""
        slot = self._slot_of.get(instance_id)
        if slot is None:
            return 0
        table = self._tables[slot]
        assert table is not None
        bit = 1 << slot
        for h in table:
            self._unmask(h, bit)
        for rec, k in Counter(table.values()).items():
            self._lose(rec, k)
        n = len(table)
        self._count -= n
        self._release_slot(slot)
        return n
