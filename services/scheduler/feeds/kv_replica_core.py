"""Scheduler-local replica of the KV index (pure core), fed by the engines' KV events.

In the manner of NVIDIA Dynamo's KV router, which keeps its own indexer fed by engine KV
events: the scheduler answers "which instance holds how much of this prompt's block chain,
per tier" from memory instead of asking kvmeta ``MatchPrefix`` before every cycle. kvmeta
stays the source of truth for every other service; this copy is a **routing hint**: a stale
or missing entry costs cache hits (a worse pick), never correctness.

No I/O, no clock, no asyncio: time (``now``, seconds) is a parameter where needed. One
replica serves one deployment (the scheduler's); the shell filters other deployments.

Layout (lean and fast in pure Python): each instance owns a small-int *slot*; per (tenant,
lora) namespace (the engines' cache salt and adapter, as in ``KVEvent``) and per tier one
``dict`` maps a block hash to an int bitmask of the slots holding it. A match ANDs the masks
along the chain (in C, ``itertools.accumulate``) and finds where each instance drops out by
bisection. Forgetting a whole instance (new epoch, ALL_CLEARED, drop) is O(1): its slot is
*retired* (excluded from matches at once) and scrubbed later by :meth:`KVReplica.compact`.

Sequencing, the same contract as kvmeta's index (``KVEventBatch``): per instance (epoch,
seq). An older epoch, or the same epoch and ``seq <= last_seq``, is a duplicate and skipped
(at-least-once delivery is harmless). A newer epoch resets the instance. A gap (``seq >
last_seq + 1``, which includes the first batch seen of an instance whose earlier batches
were trimmed from the stream) applies the batch but marks the instance *stale*: it is left
out of matches until a full state (a batch whose first event is ALL_CLEARED, possibly
continued over several batches with ``continues``) arrives without a gap. Which stale
instances to ask for that full state, and when, is :meth:`KVReplica.due_resyncs`.
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import and_, or_
from typing import Protocol

from services.scheduler.routing.types import PrefixMatch, Tier

__all__ = [
    "ALL_CLEARED",
    "REMOVED",
    "STORED",
    "TIER_NAMES",
    "Applied",
    "EventLike",
    "InstanceInfo",
    "KVReplica",
]

STORED = 1
REMOVED = 2
ALL_CLEARED = 3
# KVEvent tier numbers (tideserve.v1.Tier) → routing tier names; 0 (unspecified) is GPU.
TIER_NAMES: dict[int, Tier] = {0: "gpu", 1: "gpu", 2: "cpu", 3: "ssd", 4: "remote"}
_TIER_NUM: dict[int, int] = {0: 1, 1: 1, 2: 2, 3: 3, 4: 4}

_BITS: list[int] = [1 << s for s in range(256)]  # shared int objects for single holders


def _bit(slot: int) -> int:
    while slot >= len(_BITS):
        _BITS.extend(1 << s for s in range(len(_BITS), 2 * len(_BITS)))
    return _BITS[slot]


class Applied(enum.Enum):
    """What :meth:`KVReplica.apply` did with a batch."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"  # older epoch or already-seen seq: nothing changed
    GAP = "gap"  # applied, but batches are missing: the instance is stale until a full state


class EventLike(Protocol):
    """One KV event (``tideserve.v1.KVEvent`` satisfies this)."""

    @property
    def kind(self) -> int: ...
    @property
    def tier(self) -> int: ...
    @property
    def block_hashes(self) -> Sequence[int]: ...
    @property
    def tenant(self) -> str: ...
    @property
    def lora(self) -> str: ...


@dataclass(frozen=True)
class InstanceInfo:
    instance_id: str
    epoch: int
    last_seq: int
    stale: bool
    syncing: bool  # inside a multi-batch full state (stale until its last batch)


class _Inst:
    __slots__ = ("epoch", "instance_id", "last_seq", "slot", "stale", "syncing")

    def __init__(self, instance_id: str, slot: int, epoch: int) -> None:
        self.instance_id = instance_id
        self.slot = slot
        self.epoch = epoch
        self.last_seq = 0
        self.stale = False
        self.syncing = False


@dataclass(frozen=True)
class _Ask:
    epoch: int
    at: float
    attempts: int


class KVReplica:
    """The replica of one deployment's KV index. Not thread-safe: one owner mutates it.

    ``resync_after_s`` / ``max_resync_after_s``: a stale instance is asked for its full
    state at once, then again after ``resync_after_s`` doubling per attempt up to the max,
    while it stays stale (see :meth:`due_resyncs`).
    """

    def __init__(self, *, resync_after_s: float = 5.0, max_resync_after_s: float = 60.0) -> None:
        if resync_after_s <= 0 or max_resync_after_s < resync_after_s:
            raise ValueError("need 0 < resync_after_s <= max_resync_after_s")
        self.resync_after_s = resync_after_s
        self.max_resync_after_s = max_resync_after_s
        self._insts: dict[str, _Inst] = {}
        self._owners: dict[int, _Inst] = {}  # slot -> instance (live or stale, not retired)
        # (tenant, lora) -> tier number -> {block hash: holder slot mask}
        self._spaces: dict[tuple[str, str], dict[int, dict[int, int]]] = {}
        self._live = 0  # slots of non-stale instances
        self._retired = 0  # slots whose bits still sit in the tables (until compact)
        self._free: list[int] = []
        self._next_slot = 0
        self._asked: dict[str, _Ask] = {}
        self._absent: dict[str, float] = {}  # instance -> when it was first seen absent
        self._single: dict[tuple[int, Tier], PrefixMatch] = {}

    # ------------------------------------------------------------------ slots
    def _alloc(self) -> int:
        if self._free:
            return self._free.pop()
        self._next_slot += 1
        return self._next_slot - 1

    def _reset(self, inst: _Inst) -> None:
        """Forget every block of ``inst`` in O(1): retire its slot, give it a fresh one
        (not live: the caller decides)."""
        old = inst.slot
        self._owners.pop(old, None)
        self._live &= ~(1 << old)
        self._retired |= 1 << old
        inst.slot = self._alloc()
        self._owners[inst.slot] = inst

    def _table(self, tenant: str, lora: str, tier: int) -> dict[int, int]:
        space = self._spaces.get((tenant, lora))
        if space is None:
            space = self._spaces[(tenant, lora)] = {}
        t = _TIER_NUM.get(tier, tier)
        d = space.get(t)
        if d is None:
            d = space[t] = {}
        return d

    # ----------------------------------------------------------------- ingest
    def apply(
        self,
        instance_id: str,
        epoch: int,
        seq: int,
        events: Sequence[EventLike],
        continues: bool = False,
    ) -> Applied:
        """Apply one batch of one instance. Idempotent per (instance, epoch, seq).

        ``continues``: the batch is part of a full state (its first batch starts with
        ALL_CLEARED) that goes on in batch ``seq + 1``. Events of unknown kinds are ignored;
        REMOVED of blocks not held is a no-op.
        """
        inst = self._insts.get(instance_id)
        full = bool(events) and events[0].kind == ALL_CLEARED
        if inst is None:
            inst = _Inst(instance_id, self._alloc(), epoch)
            self._insts[instance_id] = inst
            self._owners[inst.slot] = inst
        elif epoch < inst.epoch:
            return Applied.DUPLICATE
        elif epoch > inst.epoch:
            self._reset(inst)
            inst.epoch, inst.last_seq, inst.stale, inst.syncing = epoch, 0, False, False
        elif seq <= inst.last_seq:
            return Applied.DUPLICATE
        gap = not full and seq != inst.last_seq + 1
        self._apply_events(inst, events)
        inst.last_seq = seq
        if full:
            inst.stale = inst.syncing = continues
        elif gap:
            inst.stale, inst.syncing = True, False
        elif inst.syncing and not continues:
            inst.stale = inst.syncing = False
        if inst.stale:
            self._live &= ~(1 << inst.slot)
        else:
            self._live |= 1 << inst.slot
            self._asked.pop(instance_id, None)
        return Applied.GAP if gap else Applied.APPLIED

    def _apply_events(self, inst: _Inst, events: Iterable[EventLike]) -> None:
        bit = _bit(inst.slot)
        for ev in events:
            kind = ev.kind
            if kind == ALL_CLEARED:
                self._reset(inst)
                bit = _bit(inst.slot)
                continue
            hashes = ev.block_hashes
            if not hashes:
                continue
            d = self._table(ev.tenant, ev.lora, ev.tier)
            get = d.get
            if kind == STORED:
                for h in hashes:
                    v = get(h)
                    if v is None:
                        d[h] = bit
                    elif not v & bit:
                        d[h] = v | bit
            elif kind == REMOVED:
                for h in hashes:
                    v = get(h)
                    if v is not None and v & bit:
                        v ^= bit
                        if v:
                            d[h] = v
                        else:
                            del d[h]

    def drop_instance(self, instance_id: str) -> bool:
        """Forget an instance and its blocks (it left the fleet). Idempotent."""
        inst = self._insts.pop(instance_id, None)
        if inst is None:
            return False
        self._owners.pop(inst.slot, None)
        self._live &= ~(1 << inst.slot)
        self._retired |= 1 << inst.slot
        self._asked.pop(instance_id, None)
        return True

    def retain(self, present: Iterable[str], now: float, grace_s: float) -> list[str]:
        """Drop instances missing from ``present`` (e.g. the fleet's ids) at every call for
        at least ``grace_s``; returns the dropped ids, sorted. An instance that comes back
        in time is kept; one dropped and seen again in KV events starts over (its next
        batch is a gap, so it is stale until its full state)."""
        keep = set(present)
        gone: list[str] = []
        for iid in sorted(self._insts):
            if iid in keep:
                self._absent.pop(iid, None)
                continue
            since = self._absent.setdefault(iid, now)
            if now - since >= grace_s:
                self.drop_instance(iid)
                gone.append(iid)
        for iid in [i for i in self._absent if i not in self._insts]:
            del self._absent[iid]
        return gone

    def compact(self) -> int:
        """Scrub retired slots' bits from every table and free those slots. O(entries)
        when slots are retired, else O(1); returns the entries rewritten or deleted."""
        dead = self._retired
        if not dead:
            return 0
        keep = ~dead
        changed = 0
        for space in self._spaces.values():
            for d in space.values():
                drop: list[int] = []
                for h, v in d.items():
                    if v & dead:
                        nv = v & keep
                        if nv:
                            d[h] = _bit(nv.bit_length() - 1) if nv & (nv - 1) == 0 else nv
                        else:
                            drop.append(h)
                        changed += 1
                for h in drop:
                    del d[h]
        self._free.extend(s for s in range(dead.bit_length() - 1, -1, -1) if dead >> s & 1)
        self._retired = 0
        return changed

    @property
    def retired_slots(self) -> int:
        """Slots waiting for :meth:`compact` (a cue for when to call it)."""
        return self._retired.bit_count()

    # ----------------------------------------------------------------- query
    def match(
        self,
        block_hashes: Sequence[int],
        tenant: str = "",
        lora: str = "",
        candidates: Iterable[str] | None = None,
    ) -> dict[str, PrefixMatch]:
        """Longest held prefix of the chain per instance, split by tier — the shape the
        precise-prefix plugin reads (``RequestView.prefix_matches``). Only live (non-stale)
        instances with at least one matched block appear; ``candidates`` (ids) narrows
        them. A block held in several tiers counts in each. The returned PrefixMatch
        objects may be shared between answers: read-only."""
        space = self._spaces.get((tenant, lora))
        alive = self._live
        if candidates is not None:
            cmask = 0
            for iid in candidates:
                inst = self._insts.get(iid)
                if inst is not None:
                    cmask |= 1 << inst.slot
            alive &= cmask
        if not space or not alive or not block_hashes:
            return {}
        tables = [(t, d) for t, d in space.items() if d]
        if not tables:
            return {}
        if len(tables) == 1:
            masks = map(tables[0][1].get, block_hashes, repeat(0))
        else:
            cols = [map(d.get, block_hashes, repeat(0)) for _, d in tables]
            masks = map(or_, cols[0], cols[1])
            for col in cols[2:]:
                masks = map(or_, masks, col)
        acc = list(accumulate(masks, and_, initial=alive))
        del acc[0]
        owners = self._owners
        out: dict[str, PrefixMatch] = {}
        runs: list[tuple[int, int]] = []  # (slots that drop out after j blocks, j)
        i, n = 0, len(acc)
        while i < n:
            v = acc[i]
            if not v:
                break
            j = bisect_left(acc, True, i + 1, n, key=v.__ne__)
            runs.append((v ^ acc[j] if j < n else v, j))
            i = j
        if not runs:
            return {}
        if len(tables) == 1:
            # one shared PrefixMatch per matched length, set for each slot of its run
            name = TIER_NAMES.get(tables[0][0], "gpu")
            single = self._single
            for lost, k in runs:
                pm = single.get((k, name))
                if pm is None:
                    if len(single) >= 65_536:
                        single.clear()
                    pm = single[(k, name)] = PrefixMatch(matched_blocks=k, tiers={name: k})
                while lost:
                    low = lost & -lost
                    out[owners[low.bit_length() - 1].instance_id] = pm
                    lost ^= low
            return out
        lengths: dict[int, int] = {}  # slot -> matched blocks
        for lost, k in runs:
            while lost:
                low = lost & -lost
                lengths[low.bit_length() - 1] = k
                lost ^= low
        top = max(lengths.values())
        counts = {t: _count_bits([m & a for m, a in zip(map(d.get, block_hashes[:top],
                                                            repeat(0)), acc, strict=False)])
                  for t, d in tables}  # fmt: skip
        for slot, k in lengths.items():
            tiers: dict[Tier, int] = {}
            for t, planes in counts.items():
                c = sum(((p >> slot) & 1) << b for b, p in enumerate(planes))
                if c:
                    name = TIER_NAMES.get(t, "gpu")
                    tiers[name] = tiers.get(name, 0) + c
            out[owners[slot].instance_id] = PrefixMatch(matched_blocks=k, tiers=tiers)
        return out

    # ----------------------------------------------------------- bookkeeping
    def instances(self) -> list[InstanceInfo]:
        """Known instances, sorted by id."""
        return [
            InstanceInfo(i.instance_id, i.epoch, i.last_seq, i.stale, i.syncing)
            for i in sorted(self._insts.values(), key=lambda x: x.instance_id)
        ]

    def stale_instances(self) -> list[str]:
        return sorted(i.instance_id for i in self._insts.values() if i.stale)

    def entry_count(self) -> int:
        """(block, tier, namespace, instance) entries of live or stale instances. O(entries)."""
        owned = 0
        for slot in self._owners:
            owned |= 1 << slot
        return sum(
            (v & owned).bit_count()
            for space in self._spaces.values()
            for d in space.values()
            for v in d.values()
        )

    def due_resyncs(self, now: float) -> list[tuple[str, int]]:
        """(instance id, epoch) of the stale instances to ask for a full state at ``now``,
        sorted by id, and records them as asked: one outstanding request per instance,
        repeated after ``resync_after_s`` doubling per attempt (capped) while it stays
        stale; asked at once again if its epoch changed. Call it after a successful publish
        of the previous answer only if the caller can retry: a failed publish should be
        followed by :meth:`forget_asked`."""
        out: list[tuple[str, int]] = []
        for inst in sorted(self._insts.values(), key=lambda x: x.instance_id):
            if not inst.stale:
                continue
            prev = self._asked.get(inst.instance_id)
            if prev is not None and prev.epoch == inst.epoch:
                wait = min(self.max_resync_after_s,
                           self.resync_after_s * 2.0 ** (prev.attempts - 1))  # fmt: skip
                if now - prev.at < wait:
                    continue
                attempts = prev.attempts + 1
            else:
                attempts = 1
            self._asked[inst.instance_id] = _Ask(inst.epoch, now, attempts)
            out.append((inst.instance_id, inst.epoch))
        return out

    def forget_asked(self, instance_ids: Iterable[str]) -> None:
        """Undo :meth:`due_resyncs` for these (their requests were not published)."""
        for iid in instance_ids:
            self._asked.pop(iid, None)


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
