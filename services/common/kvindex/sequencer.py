"""Epoch/seq sequencer of one instance's KV-event batches, with gap detection.

Contract (``tideserve.v1.KVEventBatch``): each batch of an instance carries (epoch, seq).

- An older epoch, or the same epoch and ``seq <= last_seq``, is a duplicate: skipped, so
  at-least-once delivery is harmless.
- A newer epoch resets the instance (its blocks are forgotten before the batch applies).
- A gap (``seq != last_seq + 1``; the first batch seen of an instance counts from
  ``last_seq = 0``) applies the batch but makes the instance *stale* (left out of matches)
  until a full state arrives.
- A *full state* is a batch whose first event is ALL_CLEARED; it replaces the instance's
  blocks and is never a gap. Sent as several batches (``continues`` on all but the last), it
  keeps the instance stale (*syncing*) until its last batch arrives without a gap, so a
  partial state is never matched.

Pure: :func:`sequence` takes the instance's :class:`SeqState` (None if never seen) and the
batch header, and returns a :class:`Step`; no I/O, no clock. Both are immutable records
(``NamedTuple`` rather than frozen dataclasses: one of each is built per ingested batch, and
a tuple is built in a third of the time).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["SeqState", "Step", "Verdict", "mark_stale", "sequence"]


class Verdict(enum.Enum):
    """What became of a batch."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"  # older epoch or already-seen seq: nothing changed
    GAP = "gap"  # applied, but batches are missing: stale until a full state (ask a resync)


class SeqState(NamedTuple):
    """Sequencing state of one instance."""

    epoch: int
    last_seq: int = 0
    stale: bool = False
    syncing: bool = False  # inside a multi-batch full state (stale until its last batch)


class Step(NamedTuple):
    """The sequencer's decision on one batch."""

    verdict: Verdict
    after: SeqState  # the instance's state once the batch is applied (``prev`` if duplicate)
    reset: bool = False  # a newer epoch: forget the instance's blocks before applying


_APPLIED, _DUPLICATE, _GAP = Verdict.APPLIED, Verdict.DUPLICATE, Verdict.GAP


def sequence(prev: SeqState | None, epoch: int, seq: int, full: bool, continues: bool) -> Step:
    """Decide on the batch (``epoch``, ``seq``) of an instance in state ``prev``.

    ``full``: the batch's first event is ALL_CLEARED; ``continues``: the full state goes on
    in batch ``seq + 1``.
    """
    reset = False
    if prev is None:
        last, stale, syncing = 0, False, False
    elif epoch < prev.epoch:
        return Step(_DUPLICATE, prev)
    elif epoch > prev.epoch:
        last, stale, syncing, reset = 0, False, False, True
    elif seq <= prev.last_seq:
        return Step(_DUPLICATE, prev)
    else:
        last, stale, syncing = prev.last_seq, prev.stale, prev.syncing
    gap = not full and seq != last + 1
    if full:
        stale = syncing = continues
    elif gap:
        stale, syncing = True, False
    elif syncing and not continues:
        stale = syncing = False
    return Step(
        Verdict.GAP if gap else Verdict.APPLIED, SeqState(epoch, seq, stale, syncing), reset
    )


def mark_stale(state: SeqState) -> SeqState:
    """``state`` made stale (events may have been lost); an unfinished full state is void."""
    return SeqState(state.epoch, state.last_seq, True, False)
