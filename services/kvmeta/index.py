"""kvmeta's prefix index: which KV blocks sit on which instance, in which tier, per deployment.

Built on the shared pure core :mod:`services.common.kvindex` (one
:class:`~services.common.kvindex.ChainIndex` per deployment: slots, the epoch/seq sequencer
with gap detection, the chain match). What is kvmeta's own here: several deployments,
instance expiry by last sign of life, the ``InstanceMatch`` answer of ``MatchPrefix``, and
snapshots for checkpoints (:mod:`services.kvmeta.index_codec`).

No I/O, no clock: time (``now``, seconds) is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.common.kvindex import (
    ALL_CLEARED,
    DEFAULT_TIER,
    MAX_SLOTS,
    REMOVED,
    STORED,
    TIERS,
    BlockEvent,
    ChainIndex,
    EventLike,
    InstanceInfo,
    Verdict,
)
from services.kvmeta.index_codec import compress_snapshot, decode, encode

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
    "PrefixIndex",
    "UnknownDeploymentError",
    "Verdict",
]


class UnknownDeploymentError(KeyError):
    """The deployment has never been seen by the index."""


@dataclass(frozen=True)
class InstanceMatch:
    instance_id: str
    matched_blocks: int
    tiers: dict[int, int]


class PrefixIndex:
    """The in-memory prefix index. Not thread-safe; one owner (the service loop) mutates it."""

    def __init__(self, instance_timeout_s: float = 0.0) -> None:
        """``instance_timeout_s``: default of ``expire`` (0 = instances never expire)."""
        self._deps: dict[str, ChainIndex] = {}
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
    ) -> Verdict:
        """Apply one batch of one instance (see :meth:`ChainIndex.apply`)."""
        dep = self._deps.get(deployment)
        if dep is None:
            dep = self._deps[deployment] = ChainIndex()
        return dep.apply(instance_id, epoch, seq, events, continues, now=now)

    # ------------------------------------------------------------ membership

    def touch(self, deployment: str, instance_id: str, now: float) -> None:
        """Record that the instance is alive (e.g. a load snapshot arrived)."""
        dep = self._deps.get(deployment)
        if dep is not None:
            dep.touch(instance_id, now)

    def drop_instance(self, deployment: str, instance_id: str) -> bool:
        """Forget an instance and all its blocks. Returns whether it was known. Idempotent."""
        dep = self._deps.get(deployment)
        return dep is not None and dep.drop(instance_id)

    def expire(self, now: float, timeout: float | None = None) -> list[tuple[str, str]]:
        """Drop instances not seen (events, ``touch``) for more than ``timeout`` seconds
        (default ``instance_timeout_s``; 0 = never); returns the dropped (deployment, id)."""
        timeout = self.instance_timeout_s if timeout is None else timeout
        if timeout <= 0:
            return []
        gone = [
            (name, iid)
            for name, dep in self._deps.items()
            for iid, inst in dep.state.instances.items()
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
        return sum(self._deps[n].compact() for n in list(names) if n in self._deps)

    # ----------------------------------------------------------------- query

    def has_deployment(self, deployment: str) -> bool:
        return deployment in self._deps

    def _dep(self, deployment: str) -> ChainIndex:
        dep = self._deps.get(deployment)
        if dep is None:
            raise UnknownDeploymentError(deployment)
        return dep

    def instances(self, deployment: str) -> list[InstanceInfo]:
        """Known instances of a deployment, sorted by id. Raises UnknownDeploymentError."""
        return self._dep(deployment).instances()

    def stale_instances(self, deployment: str) -> list[str]:
        dep = self._deps.get(deployment)
        return dep.stale_instances() if dep else []

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
        m = self._dep(deployment).lookup(block_hashes, tenant, lora, candidates)
        out: list[InstanceMatch] = []
        tier, tiers = m.tier, m.tiers
        for ids, k in reversed(m.runs):
            for iid in sorted(ids):
                out.append(InstanceMatch(iid, k, {tier: k} if tier else dict(tiers[iid])))
        return out

    # ------------------------------------------------------------- snapshots

    def snapshot(self, deployments: Iterable[str] | None = None) -> bytes:
        """Compact, self-contained bytes of the index (or of some deployments)."""
        return compress_snapshot(self.snapshot_raw(deployments))

    def snapshot_raw(self, deployments: Iterable[str] | None = None) -> bytes:
        """Uncompressed snapshot; ``compress_snapshot`` it (e.g. in a thread: zlib drops
        the GIL) to get ``snapshot()`` bytes. Only this part must run with the index idle."""
        names = self._deps if deployments is None else [d for d in deployments if d in self._deps]
        return encode({d: self._deps[d].state for d in names})

    @classmethod
    def restore(cls, data: bytes) -> PrefixIndex:
        """Rebuild an index from ``snapshot()`` bytes. Raises ValueError if corrupt."""
        idx = cls()
        idx.load_snapshot(data)
        return idx

    def load_snapshot(self, data: bytes) -> list[str]:
        """Replace the deployments contained in ``data``; returns their names. ValueError."""
        deps = decode(data)
        self._deps.update((name, ChainIndex(st)) for name, st in deps.items())
        return list(deps)

    def deployments(self) -> list[str]:
        return sorted(self._deps)

    def mark_stale(self, deployment: str) -> list[str]:
        """Mark every instance of a deployment stale (events may have been lost)."""
        dep = self._deps.get(deployment)
        return dep.mark_stale() if dep else []

    def retired_slots(self, deployment: str) -> int:
        """Slots waiting for ``compact`` (a cue for when to call it)."""
        dep = self._deps.get(deployment)
        return dep.retired_slots if dep else 0

    def entry_count(self) -> int:
        """Number of (block, tier, instance) entries, counting retired slots not yet scrubbed."""
        return sum(dep.entry_count() for dep in self._deps.values())
