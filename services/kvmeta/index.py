"""Pure prefix index: which KV blocks sit on which instance, in which tier.

No I/O, no clock: time (``now``, seconds) is a parameter.

Layout (chosen for memory and match speed in pure Python):

- Per deployment, each instance owns a *slot* (a small int). Per (deployment, tenant, lora,
  tier) one ``dict`` maps a block hash to a compact *holder value* naming the slots that hold
  the block: ``~s`` (a negative int, shared object) for a single slot ``s``; a packed negative
  int ``<= -_PAIR_BASE`` for exactly two slots; a positive int bitmask for more. So one dict
  entry serves every instance holding the block.
- Removing a whole instance (new epoch, ALL_CLEARED, drop, expiry, resync) is O(1): its slot
  is *retired* (excluded from every match by the live mask) and its bits are scrubbed later by
  ``compact``, after which the slot is reused.
- Matching walks the chain ANDing holder masks and stops when no candidate is left.

Sequencing per (deployment, instance): batches carry (epoch, seq). A batch with an older epoch,
or the same epoch and ``seq <= last_seq``, is skipped (idempotent at-least-once delivery). A
newer epoch resets the instance. A gap (``seq > last_seq + 1``) applies the batch but marks the
instance *stale* (excluded from matches) and returns ``RESYNC_NEEDED``; a batch whose first
event is ALL_CLEARED is a full state replacement and clears the stale flag. A full state sent
as several batches (``continues`` on all but the last) keeps the instance stale (*syncing*)
until its last batch arrives without a gap, so a partial state is never matched.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

STORED = 1
REMOVED = 2
ALL_CLEARED = 3
TIERS = (1, 2, 3, 4)
DEFAULT_TIER = 1
MAX_SLOTS = 1 << 16

_PAIR_BASE = 1 << 17  # pair values are -(_PAIR_BASE + (lo << 16 | hi)); singles are ~s >= -2**16
_NEG: list[int] = [~s for s in range(1024)]


def _neg(slot: int) -> int:
    while slot >= len(_NEG):
        _NEG.extend(~s for s in range(len(_NEG), len(_NEG) * 2))
    return _NEG[slot]


def _mask(v: int) -> int:
    """Bitmask of slots named by holder value ``v``."""
    if v >= 0:
        return v
    if v > -_PAIR_BASE:
        return 1 << ~v
    p = -v - _PAIR_BASE
    return (1 << (p >> 16)) | (1 << (p & 0xFFFF))


def _from_mask(m: int) -> int | None:
    """Most compact holder value for mask ``m`` (None if empty)."""
    if m == 0:
        return None
    low = m & -m
    rest = m ^ low
    if rest == 0:
        return _neg(low.bit_length() - 1)
    if rest & (rest - 1) == 0:
        return -(_PAIR_BASE + ((low.bit_length() - 1) << 16 | (rest.bit_length() - 1)))
    return m


class UnknownDeploymentError(KeyError):
    """The deployment has never been seen by the index."""


class Outcome(enum.Enum):
    APPLIED = "applied"
    SKIPPED = "skipped"
    RESYNC_NEEDED = "resync_needed"


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
class BlockEvent:
    """Domain KV event; ``kind`` is STORED / REMOVED / ALL_CLEARED, ``tier`` 1..4 (0 = GPU)."""

    kind: int
    block_hashes: Sequence[int] = ()
    tier: int = DEFAULT_TIER
    tenant: str = ""
    lora: str = ""


@dataclass(frozen=True)
class InstanceMatch:
    instance_id: str
    matched_blocks: int
    tiers: dict[int, int]


@dataclass(frozen=True)
class InstanceInfo:
    deployment: str
    instance_id: str
    epoch: int
    last_seq: int
    blocks: int
    stale: bool
    last_seen: float
    syncing: bool = False  # a multi-batch full state is arriving (stale until it ends)


@dataclass
class _Inst:
    instance_id: str
    slot: int
    epoch: int
    last_seq: int = 0
    stale: bool = False
    last_seen: float = 0.0
    blocks: int = 0
    syncing: bool = False  # inside a multi-batch full state (stale until its last batch)


@dataclass
class _Dep:
    instances: dict[str, _Inst] = field(default_factory=dict)
    owners: dict[int, _Inst] = field(default_factory=dict)
    # (tenant, lora) -> tier -> {block_hash: holder value}
    spaces: dict[tuple[str, str], dict[int, dict[int, int]]] = field(default_factory=dict)
    live: int = 0  # slots owned by non-stale instances
    retired: int = 0  # slots whose bits still need scrubbing
    free: list[int] = field(default_factory=list)
    next_slot: int = 0


class PrefixIndex:
    """The in-memory prefix index. Not thread-safe; one owner (the service loop) mutates it."""

    def __init__(self, instance_timeout_s: float = 0.0) -> None:
        """``instance_timeout_s``: default of ``expire`` (0 = instances never expire)."""
        self._deps: dict[str, _Dep] = {}
        self.instance_timeout_s = instance_timeout_s

    # ------------------------------------------------------------------ ingest

    def apply_batch(
        self,
        deployment: str,
        instance_id: str,
        epoch: int,
        seq: int,
        events: Sequence[EventLike],
        now: float,
        continues: bool = False,
    ) -> Outcome:
        """Apply one batch of one instance. Idempotent per (instance, epoch, seq).

        ``continues``: the batch belongs to a full state (first batch: ALL_CLEARED first)
        that goes on in batch ``seq + 1``; the instance stays stale until the full state's
        last batch (``continues`` false) arrives without a gap.
        """
        dep = self._deps.get(deployment)
        if dep is None:
            dep = self._deps[deployment] = _Dep()
        inst = dep.instances.get(instance_id)
        full = bool(events) and events[0].kind == ALL_CLEARED
        if inst is None:
            inst = self._new_inst(dep, instance_id, epoch)
        elif epoch < inst.epoch:
            return Outcome.SKIPPED
        elif epoch > inst.epoch:
            self._reset(dep, inst)
            inst.epoch, inst.last_seq, inst.stale, inst.syncing = epoch, 0, False, False
            dep.live |= 1 << inst.slot
        elif seq <= inst.last_seq:
            return Outcome.SKIPPED
        gap = not full and seq != inst.last_seq + 1
        self._apply_events(dep, inst, events)
        inst.last_seq = seq
        inst.last_seen = max(inst.last_seen, now)
        if full:
            inst.stale = inst.syncing = continues
        elif gap:
            inst.stale, inst.syncing = True, False
        elif inst.syncing and not continues:
            inst.stale = inst.syncing = False
        if inst.stale:
            dep.live &= ~(1 << inst.slot)
        else:
            dep.live |= 1 << inst.slot
        return Outcome.RESYNC_NEEDED if gap else Outcome.APPLIED

    def _apply_events(self, dep: _Dep, inst: _Inst, events: Iterable[EventLike]) -> None:
        slot = inst.slot
        neg = _neg(slot)
        bit = 1 << slot
        count = inst.blocks
        for ev in events:
            kind = ev.kind
            if kind == ALL_CLEARED:
                inst.blocks = 0
                self._reset(dep, inst)
                if not inst.stale:
                    dep.live |= 1 << inst.slot
                slot, neg, bit, count = inst.slot, _neg(inst.slot), 1 << inst.slot, 0
                continue
            hashes = ev.block_hashes
            if not hashes:
                continue
            d = self._table(dep, ev.tenant, ev.lora, ev.tier or DEFAULT_TIER)
            get = d.get
            if kind == STORED:
                for h in hashes:
                    v = get(h)
                    if v is None:
                        d[h] = neg
                        count += 1
                    elif v != neg:
                        m = _mask(v)
                        if not m & bit:
                            nv = _from_mask((m & ~dep.retired) | bit)
                            assert nv is not None
                            d[h] = nv
                            count += 1
            elif kind == REMOVED:
                for h in hashes:
                    v = get(h)
                    if v is None:
                        continue
                    if v == neg:
                        del d[h]
                        count -= 1
                    else:
                        m = _mask(v)
                        if m & bit:
                            nv = _from_mask(m ^ bit)
                            if nv is None:
                                del d[h]
                            else:
                                d[h] = nv
                            count -= 1
        inst.blocks = count

    def _table(self, dep: _Dep, tenant: str, lora: str, tier: int) -> dict[int, int]:
        space = dep.spaces.get((tenant, lora))
        if space is None:
            space = dep.spaces[(tenant, lora)] = {}
        d = space.get(tier)
        if d is None:
            d = space[tier] = {}
        return d

    def _new_inst(self, dep: _Dep, instance_id: str, epoch: int) -> _Inst:
        inst = _Inst(instance_id, self._alloc_slot(dep), epoch)
        dep.instances[instance_id] = inst
        dep.owners[inst.slot] = inst
        dep.live |= 1 << inst.slot
        return inst

    def _alloc_slot(self, dep: _Dep) -> int:
        if dep.free:
            return dep.free.pop()
        if dep.next_slot >= MAX_SLOTS:
            raise OverflowError("too many instance slots in one deployment; call compact()")
        dep.next_slot += 1
        return dep.next_slot - 1

    def _retire(self, dep: _Dep, slot: int) -> None:
        dep.owners.pop(slot, None)
        dep.live &= ~(1 << slot)
        dep.retired |= 1 << slot

    def _reset(self, dep: _Dep, inst: _Inst) -> None:
        """Forget every block of ``inst`` in O(1): retire its slot, give it a fresh one."""
        self._retire(dep, inst.slot)
        inst.slot = self._alloc_slot(dep)
        inst.blocks = 0
        dep.owners[inst.slot] = inst

    # ------------------------------------------------------------ membership

    def touch(self, deployment: str, instance_id: str, now: float) -> None:
        """Record that the instance is alive (e.g. a load snapshot arrived)."""
        dep = self._deps.get(deployment)
        inst = dep.instances.get(instance_id) if dep else None
        if inst is not None:
            inst.last_seen = max(inst.last_seen, now)

    def drop_instance(self, deployment: str, instance_id: str) -> bool:
        """Forget an instance and all its blocks. Returns whether it was known. Idempotent."""
        dep = self._deps.get(deployment)
        inst = dep.instances.pop(instance_id, None) if dep else None
        if dep is None or inst is None:
            return False
        self._retire(dep, inst.slot)
        return True

    def expire(self, now: float, timeout: float | None = None) -> list[tuple[str, str]]:
        """Drop instances not seen (events, ``touch``) for more than ``timeout`` seconds
        (default ``instance_timeout_s``; 0 = never); returns the dropped (deployment, id)."""
        timeout = self.instance_timeout_s if timeout is None else timeout
        if timeout <= 0:
            return []
        gone = [
            (name, iid)
            for name, dep in self._deps.items()
            for iid, inst in dep.instances.items()
            if now - inst.last_seen > timeout
        ]
        for name, iid in gone:
            self.drop_instance(name, iid)
        return gone

    def compact(self, deployments: Iterable[str] | None = None) -> int:
        """Scrub bits of retired slots from every table and free those slots.

        O(entries of the deployments with retired slots); returns the number of entries
        rewritten or deleted. Call when idle (e.g. after instances left).
        """
        changed = 0
        names = self._deps if deployments is None else deployments
        for dep in [self._deps[n] for n in names if n in self._deps]:
            dead = dep.retired
            if not dead:
                continue
            for space in dep.spaces.values():
                for d in space.values():
                    drop: list[int] = []
                    for h, v in d.items():
                        m = _mask(v)
                        if m & dead:
                            nv = _from_mask(m & ~dead)
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

    # ----------------------------------------------------------------- query

    def has_deployment(self, deployment: str) -> bool:
        return deployment in self._deps

    def instances(self, deployment: str) -> list[InstanceInfo]:
        """Known instances of a deployment, sorted by id. Raises UnknownDeploymentError."""
        dep = self._deps.get(deployment)
        if dep is None:
            raise UnknownDeploymentError(deployment)
        return [
            InstanceInfo(
                deployment,
                i.instance_id,
                i.epoch,
                i.last_seq,
                i.blocks,
                i.stale,
                i.last_seen,
                i.syncing,
            )
            for i in sorted(dep.instances.values(), key=lambda x: x.instance_id)
        ]

    def stale_instances(self, deployment: str) -> list[str]:
        dep = self._deps.get(deployment)
        return sorted(i.instance_id for i in dep.instances.values() if i.stale) if dep else []

    def match_prefix(
        self,
        deployment: str,
        tenant: str,
        block_hashes: Sequence[int],
        candidates: Iterable[str] | None = None,
        lora: str = "",
    ) -> list[InstanceMatch]:
        """Longest chain prefix per instance, split by tier; longest first, then by id.

        Only instances with at least one matched block are returned; stale instances never.
        Raises UnknownDeploymentError for a deployment never seen.
        """
        dep = self._deps.get(deployment)
        if dep is None:
            raise UnknownDeploymentError(deployment)
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
                nxt = 0 if v is None else alive & _mask(v)
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
                        m = _mask(v) & alive
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

    # ------------------------------------------------------------- snapshots

    def snapshot(self, deployments: Iterable[str] | None = None) -> bytes:
        """Compact, self-contained bytes of the index (or of some deployments)."""
        from services.kvmeta.index_codec import compress_snapshot

        return compress_snapshot(self.snapshot_raw(deployments))

    def snapshot_raw(self, deployments: Iterable[str] | None = None) -> bytes:
        """Uncompressed snapshot; ``compress_snapshot`` it (e.g. in a thread: zlib drops
        the GIL) to get ``snapshot()`` bytes. Only this part must run with the index idle."""
        from services.kvmeta.index_codec import encode  # the codec imports this module

        if deployments is None:
            return encode(self._deps)
        return encode({d: self._deps[d] for d in deployments if d in self._deps})

    @classmethod
    def restore(cls, data: bytes) -> PrefixIndex:
        """Rebuild an index from ``snapshot()`` bytes. Raises ValueError if corrupt."""
        from services.kvmeta.index_codec import decode

        idx = cls()
        idx._deps = decode(data)
        return idx

    def load_snapshot(self, data: bytes) -> list[str]:
        """Replace the deployments contained in ``data``; returns their names. ValueError."""
        from services.kvmeta.index_codec import decode

        deps = decode(data)
        self._deps.update(deps)
        return list(deps)

    def deployments(self) -> list[str]:
        return sorted(self._deps)

    def mark_stale(self, deployment: str) -> list[str]:
        """Mark every instance of a deployment stale (events may have been lost)."""
        dep = self._deps.get(deployment)
        if dep is None:
            return []
        for inst in dep.instances.values():
            inst.stale, inst.syncing = True, False
        dep.live = 0
        return sorted(dep.instances)

    def retired_slots(self, deployment: str) -> int:
        """Slots waiting for ``compact`` (a cue for when to call it)."""
        dep = self._deps.get(deployment)
        return bin(dep.retired).count("1") if dep else 0

    def entry_count(self) -> int:
        """Number of (block, tier, instance) entries, counting retired slots not yet scrubbed."""
        return sum(i.blocks for dep in self._deps.values() for i in dep.instances.values())


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
