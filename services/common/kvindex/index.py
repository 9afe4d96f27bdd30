"""One index of KV blocks (one deployment): events in, chain matches out.

Contract: :meth:`ChainIndex.apply` takes one batch of one instance, sequences it with
:func:`~services.common.kvindex.sequencer.sequence` (duplicates skipped, a newer epoch
resets, a gap applies but makes the instance stale, a full state heals it) and applies its
events to the slot tables of :mod:`~services.common.kvindex.slots`: STORED adds the
instance to each block's holders, REMOVED takes it out (a no-op for blocks not held),
ALL_CLEARED forgets all its blocks; other kinds are ignored. :meth:`ChainIndex.match`
answers (:meth:`ChainIndex.lookup`) with :func:`~services.common.kvindex.match.match_chain`. Stale instances never
match. Forgetting an instance is O(1); :meth:`ChainIndex.compact` scrubs later.

Pure: no I/O, no clock (``now``, seconds, is passed in and only kept as ``last_seen``). Not
thread-safe: one owner mutates it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.common.kvindex.events import ALL_CLEARED, DEFAULT_TIER, REMOVED, STORED, EventLike
from services.common.kvindex.match import ChainMatch, match_chain
from services.common.kvindex.sequencer import Verdict, mark_stale, sequence
from services.common.kvindex.slots import (
    IndexState,
    InstState,
    compact,
    holder_from_mask,
    holder_mask,
    new_instance,
    reset_instance,
    retire_slot,
    slot_bit,
    table,
)

__all__ = ["ChainIndex", "InstanceInfo"]

_DUPLICATE = Verdict.DUPLICATE


@dataclass(frozen=True)
class InstanceInfo:
    instance_id: str
    epoch: int
    last_seq: int
    blocks: int
    stale: bool
    last_seen: float
    syncing: bool = False  # a multi-batch full state is arriving (stale until it ends)


class ChainIndex:
    """The index of one deployment's KV blocks, over an :class:`IndexState`."""

    __slots__ = ("state",)

    def __init__(self, state: IndexState | None = None) -> None:
        self.state = IndexState() if state is None else state

    # ------------------------------------------------------------------ ingest
    def apply(
        self,
        instance_id: str,
        epoch: int,
        seq: int,
        events: Sequence[EventLike],
        continues: bool = False,
        *,
        now: float = 0.0,
    ) -> Verdict:
        """Apply one batch of one instance. Idempotent per (instance, epoch, seq).

        ``continues``: the batch belongs to a full state (first batch: ALL_CLEARED first)
        that goes on in batch ``seq + 1``. Events of unknown kinds are ignored; REMOVED of
        blocks not held is a no-op. ``now`` is kept as the instance's last sign of life.
        """
        st = self.state
        inst = st.instances.get(instance_id)
        full = bool(events) and events[0].kind == ALL_CLEARED
        step = sequence(None if inst is None else inst.seq, epoch, seq, full, continues)
        if step.verdict is _DUPLICATE:
            return _DUPLICATE
        if inst is None:
            inst = new_instance(st, instance_id, step.after)
        elif step.reset:
            reset_instance(st, inst)
        _apply_events(st, inst, events)
        inst.seq = step.after
        if now > inst.last_seen:
            inst.last_seen = now
        if step.after.stale:
            st.live &= ~(1 << inst.slot)
        else:
            st.live |= 1 << inst.slot
        return step.verdict

    # -------------------------------------------------------------- membership
    def touch(self, instance_id: str, now: float) -> None:
        """Record that the instance is alive (e.g. a load snapshot arrived)."""
        inst = self.state.instances.get(instance_id)
        if inst is not None and now > inst.last_seen:
            inst.last_seen = now

    def drop(self, instance_id: str) -> bool:
        """Forget an instance and all its blocks. Returns whether it was known. Idempotent."""
        inst = self.state.instances.pop(instance_id, None)
        if inst is None:
            return False
        retire_slot(self.state, inst.slot)
        return True

    def mark_stale(self) -> list[str]:
        """Mark every instance stale (events may have been lost); returns their ids, sorted."""
        st = self.state
        for inst in st.instances.values():
            inst.seq = mark_stale(inst.seq)
        st.live = 0
        return sorted(st.instances)

    def compact(self) -> int:
        """Scrub retired slots' bits from every table and free those slots. O(entries)
        when slots are retired, else O(1); returns the entries rewritten or deleted."""
        return compact(self.state)

    @property
    def retired_slots(self) -> int:
        """Slots waiting for :meth:`compact` (a cue for when to call it)."""
        return self.state.retired.bit_count()

    # ------------------------------------------------------------------- query
    def lookup(
        self,
        block_hashes: Sequence[int],
        tenant: str = "",
        lora: str = "",
        candidates: Iterable[str] | None = None,
    ) -> ChainMatch:
        """Longest held prefix of the chain per live instance (see ``match_chain``)."""
        return match_chain(self.state, tenant, lora, block_hashes, candidates)

    def instances(self) -> list[InstanceInfo]:
        """Known instances, sorted by id."""
        return [
            InstanceInfo(
                i.instance_id,
                i.seq.epoch,
                i.seq.last_seq,
                i.blocks,
                i.seq.stale,
                i.last_seen,
                i.seq.syncing,
            )
            for i in sorted(self.state.instances.values(), key=lambda x: x.instance_id)
        ]

    def stale_instances(self) -> list[str]:
        return sorted(i.instance_id for i in self.state.instances.values() if i.seq.stale)

    def entry_count(self) -> int:
        """(block, tier, namespace, instance) entries of known instances."""
        return sum(i.blocks for i in self.state.instances.values())


def _apply_events(st: IndexState, inst: InstState, events: Iterable[EventLike]) -> None:
    bit = slot_bit(inst.slot)
    keep = ~st.retired
    count = inst.blocks
    for ev in events:
        kind = ev.kind
        if kind == ALL_CLEARED:
            reset_instance(st, inst)
            bit, keep, count = slot_bit(inst.slot), ~st.retired, 0
            continue
        hashes = ev.block_hashes
        if not hashes:
            continue
        d = table(st, ev.tenant, ev.lora, ev.tier or DEFAULT_TIER)
        get = d.get
        if kind == STORED:
            for h in hashes:
                v = get(h)
                if v is None:
                    d[h] = bit
                    count += 1
                elif v != bit:
                    m = v if v >= 0 else holder_mask(v)
                    if not m & bit:
                        nv = holder_from_mask((m & keep) | bit)
                        assert nv is not None
                        d[h] = nv
                        count += 1
        elif kind == REMOVED:
            for h in hashes:
                v = get(h)
                if v is None:
                    continue
                if v == bit:
                    del d[h]
                    count -= 1
                else:
                    m = v if v >= 0 else holder_mask(v)
                    if m & bit:
                        nv = holder_from_mask(m ^ bit)
                        if nv is None:
                            del d[h]
                        else:
                            d[h] = nv
                        count -= 1
    inst.blocks = count
