"""One ingest path for every source: validate -> one transaction -> windows -> observers.

Per batch, in **one** Postgres transaction: the new request ids go into the ledger, the
records whose id was new are copied into ``request_records``, and this replica's rollup rows
of every bucket those records touch are rewritten with the bucket's new state. So a record's
contribution to the rollups is committed exactly when the record is, and a redelivered record
(its id already in the ledger) adds nothing anywhere: windows never double count, and nothing
committed is missing from them after a crash.

The new records are added straight into the in-memory buckets before the upsert (the rows
written are memory's buckets); if the transaction fails, memory is marked stale and reloaded
from this replica's rollup rows before the next batch (or query through ingest). Buckets
older than memory's floor ("late" records) are read from the rollups, merged and written back
in the same transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tideserve.v1 import events_pb2

from services.telemetry.ports import RecordObserver
from services.telemetry.store.pg import RecordStore
from services.telemetry.windows.bucket import Bucket, BucketKey, add_records_to
from services.telemetry.windows.classes import SLOClass
from services.telemetry.windows.memory import WindowMemory
from services.telemetry.windows.stats import Filters
from services.telemetry.windows.validate import Rejection, ValidationRules, validate

__all__ = ["Ingest", "IngestCounts", "IngestResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    """``rejected``: (index in the batch, why). ``new``: the records committed now."""

    accepted: int
    duplicates: int
    rejected: tuple[tuple[int, Rejection], ...]
    new: tuple[events_pb2.RequestRecord, ...] = ()


@dataclass
class IngestCounts:
    """Since start: records by result, rejections by reason (the Prometheus counters)."""

    results: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)


class Ingest:
    def __init__(
        self,
        store: RecordStore,
        memory: WindowMemory,
        *,
        rules: ValidationRules,
        classes: Mapping[str, SLOClass],
        replica_id: str,
        observers: Sequence[RecordObserver] = (),
        wall: Callable[[], float],
    ) -> None:
        self.store = store
        self.memory = memory
        self.rules = rules
        self.classes = dict(classes)
        self.replica_id = replica_id
        self.observers = tuple(observers)
        self.counts = IngestCounts()
        self._wall = wall
        self._lock = asyncio.Lock()
        self._stale = True

    def now_ms(self) -> int:
        return int(self._wall() * 1000)

    async def load(self) -> None:
        """(Re)load this replica's rollup rows of memory's range into memory."""
        now = self.now_ms()
        rows = await self.store.read_rollups(
            self.memory.floor(now), now + 86_400_000, _ALL, replica_id=self.replica_id
        )
        self.memory.clear()
        self.memory.replace((key, summary.bucket()) for key, summary in rows)
        self._stale = False

    async def ingest(self, records: Sequence[events_pb2.RequestRecord]) -> IngestResult:
        """Validate, commit and apply ``records``; returns after the commit. Raises a
        psycopg error (nothing committed) when Postgres fails."""
        now = self.now_ms()
        rejected: list[tuple[int, Rejection]] = []
        valid: list[events_pb2.RequestRecord] = []
        seen: set[str] = set()
        in_batch_dups = 0
        for i, rec in enumerate(records):
            why = validate(rec, self.rules, now)
            if why is not None:
                rejected.append((i, why))
            elif rec.request_id in seen:
                in_batch_dups += 1
            else:
                seen.add(rec.request_id)
                valid.append(rec)
        async with self._lock:
            new = await self._commit(valid, now) if valid else []
        result = IngestResult(
            accepted=len(new),
            duplicates=len(valid) - len(new) + in_batch_dups,
            rejected=tuple(rejected),
            new=tuple(new),
        )
        self.counts.results.update(
            accepted=result.accepted, duplicate=result.duplicates, rejected=len(rejected)
        )
        self.counts.reasons.update(r.code for _, r in rejected)
        if new:
            for observer in self.observers:
                try:
                    observer.observe_records(now, new)
                except Exception:
                    log.exception("record observer %r failed", observer)
        return result

    async def _commit(
        self, valid: Sequence[events_pb2.RequestRecord], now: int
    ) -> list[events_pb2.RequestRecord]:
        if self._stale:
            await self.load()
        self.memory.evict(now)
        await self.store.ensure_partitions(r.finish_ms for r in valid)
        try:
            async with self.store.transaction() as cur:
                idx = await self.store.insert_new(cur, valid)
                new = [valid[i] for i in idx]
                touched: set[BucketKey] = set()
                late: dict[BucketKey, Bucket] = {}

                def bucket(key: BucketKey) -> Bucket:
                    if self.memory.held(key, now):
                        touched.add(key)
                        return self.memory.bucket(key)
                    b = late.get(key)
                    if b is None:
                        b = late[key] = Bucket()
                    return b

                self._stale = True  # until committed: memory holds uncommitted records
                add_records_to(bucket, new, self.classes, self.memory.bucket_ms)
                rows = await self.store.fetch_rollups(cur, self.replica_id, late)
                for k, delta in late.items():
                    rows.setdefault(k, Bucket()).merge(delta)
                for k in touched:
                    rows[k] = self.memory.bucket(k)
                await self.store.upsert_rollups(cur, self.replica_id, rows, now)
        except BaseException:
            log.warning("telemetry ingest: batch of %d not committed", len(valid))
            raise
        self._stale = False
        return new


_ALL = Filters()
