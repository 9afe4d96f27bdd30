"""Pure prefix index: which KV blocks sit on which instance, in which tier.

No I/O, no clock: time (``now``, seconds) is a parameter.

Layout (chosen for memory and match speed in pure Python; see
:mod:`services.kvmeta.index_state`): per deployment each instance owns a *slot*; per
(deployment, tenant, lora, tier) one ``dict`` maps a block hash to a compact *holder value*
naming the slots that hold it, so one entry serves every instance holding the block. Removing
a whole instance (new epoch, ALL_CLEARED, drop, expiry, resync) is O(1): its slot is *retired*
(excluded from every match by the live mask) and scrubbed later by ``compact``. Matching walks
the chain ANDing holder masks and stops when no candidate is left. Snapshots:
:mod:`services.kvmeta.index_codec`.

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
from dataclasses import dataclass
from typing import Protocol

from services.kvmeta.index_codec import compress_snapshot, decode, encode
from services.kvmeta.index_match import InstanceMatch, match_chain
from services.kvmeta.index_state import (
    MAX_SLOTS,
    DepState,
    InstState,
    compact,
    holder_from_mask,
    holder_mask,
    new_instance,
    reset_instance,
    retire_slot,
    slot_holder,
    table,
)

__all__ = [
    "ALL_CLEARED",
    "DEFAULT_TIER",
    "MAX_SLOTS",
    "REMOVED",
    "STORED",
    "TIERS",
    "BlockEvent",
    "EventLike",
    "InstanceInfo",
    "InstanceMatch",
    "Outcome",
    "PrefixIndex",
    "UnknownDeploymentError",
]

STORED = 1
REMOVED = 2
ALL_CLEARED = 3
TIERS = (1, 2, 3, 4)
DEFAULT_TIER = 1


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
class InstanceInfo:
    deployment: str
    instance_id: str
    epoch: int
    last_seq: int
    blocks: int
    stale: bool
    last_seen: float
    syncing: bool = False  # a multi-batch full state is arriving (stale until it ends)


class PrefixIndex:
    """The in-memory prefix index. Not thread-safe; one owner (the service loop) mutates it."""

    def __init__(self, instance_timeout_s: float = 0.0) -> None:
        """``instance_timeout_s``: default of ``expire`` (0 = instances never expire)."""
        self._deps: dict[str, DepState] = {}
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
            dep = self._deps[deployment] = DepState()
        inst = dep.instances.get(instance_id)
        full = bool(events) and events[0].kind == ALL_CLEARED
        if inst is None:
            inst = new_instance(dep, instance_id, epoch)
        elif epoch < inst.epoch:
            return Outcome.SKIPPED
        elif epoch > inst.epoch:
            reset_instance(dep, inst)
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

    def _apply_events(self, dep: DepState, inst: InstState, events: Iterable[EventLike]) -> None:
        slot = inst.slot
        neg = slot_holder(slot)
        bit = 1 << slot
        count = inst.blocks
        for ev in events:
            kind = ev.kind
            if kind == ALL_CLEARED:
                inst.blocks = 0
                reset_instance(dep, inst)
                if not inst.stale:
                    dep.live |= 1 << inst.slot
                slot, neg, bit, count = inst.slot, slot_holder(inst.slot), 1 << inst.slot, 0
                continue
            hashes = ev.block_hashes
            if not hashes:
                continue
            d = table(dep, ev.tenant, ev.lora, ev.tier or DEFAULT_TIER)
            get = d.get
            if kind == STORED:
                for h in hashes:
                    v = get(h)
                    if v is None:
                        d[h] = neg
                        count += 1
                    elif v != neg:
                        m = holder_mask(v)
                        if not m & bit:
                            nv = holder_from_mask((m & ~dep.retired) | bit)
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
                        m = holder_mask(v)
                        if m & bit:
                            nv = holder_from_mask(m ^ bit)
                            if nv is None:
                                del d[h]
                            else:
                                d[h] = nv
                            count -= 1
        inst.blocks = count

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
        retire_slot(dep, inst.slot)
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
        names = self._deps if deployments is None else deployments
        return sum(compact(self._deps[n]) for n in list(names) if n in self._deps)

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
        return match_chain(dep, tenant, lora, block_hashes, candidates)

    # ------------------------------------------------------------- snapshots

    def snapshot(self, deployments: Iterable[str] | None = None) -> bytes:
        """Compact, self-contained bytes of the index (or of some deployments)."""
        return compress_snapshot(self.snapshot_raw(deployments))

    def snapshot_raw(self, deployments: Iterable[str] | None = None) -> bytes:
        """Uncompressed snapshot; ``compress_snapshot`` it (e.g. in a thread: zlib drops
        the GIL) to get ``snapshot()`` bytes. Only this part must run with the index idle."""
        if deployments is None:
            return encode(self._deps)
        return encode({d: self._deps[d] for d in deployments if d in self._deps})

    @classmethod
    def restore(cls, data: bytes) -> PrefixIndex:
        """Rebuild an index from ``snapshot()`` bytes. Raises ValueError if corrupt."""
        idx = cls()
        idx._deps = decode(data)
        return idx

    def load_snapshot(self, data: bytes) -> list[str]:
        """Replace the deployments contained in ``data``; returns their names. ValueError."""
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
