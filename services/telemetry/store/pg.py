"""Postgres access of telemetry (psycopg 3, async): one connection for writes (ingest, in
transactions it orders), one for reads. Both reconnect after an error.

Schema (migration 0002): ``request_records`` partitioned by finish time, the ``request_ids``
ledger that makes inserts idempotent, and ``rollups`` (one row per replica x slice x bucket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

import psycopg
from psycopg import sql
from tideserve.v1 import events_pb2

from services.common.db import to_libpq_url
from services.telemetry.store import partitions
from services.telemetry.windows.bucket import Bucket, BucketKey, SliceKey, Summary
from services.telemetry.windows.codec import decode_bucket, encode_bucket
from services.telemetry.windows.stats import Filters

__all__ = ["RecordStore"]

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[object, ...]]
Cursor = psycopg.AsyncCursor[tuple[object, ...]]

_RECORD_COLUMNS = (
    "request_id",
    "finish_ms",
    "arrival_ms",
    "deployment",
    "tenant",
    "slo_class",
    "session_id",
    "outcome",
    "record",
)
_RECORD_TYPES = ("text", "int8", "int8", "text", "text", "text", "text", "int2", "bytea")
_COPY = sql.SQL("COPY telemetry.request_records ({}) FROM STDIN (FORMAT BINARY)").format(
    sql.SQL(", ").join(sql.Identifier(c) for c in _RECORD_COLUMNS)
)
_LEDGER = (
    "INSERT INTO telemetry.request_ids (request_id, finish_ms) "
    "SELECT * FROM unnest(%s::text[], %s::int8[]) ON CONFLICT DO NOTHING RETURNING request_id"
)
_UPSERT = (
    "INSERT INTO telemetry.rollups "
    "(replica_id, bucket_ms, deployment, role, slo_class, tenant, data, updated_ms) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (replica_id, bucket_ms, deployment, role, slo_class, tenant) "
    "DO UPDATE SET data = EXCLUDED.data, updated_ms = EXCLUDED.updated_ms, "
    "version = telemetry.rollups.version + 1"
)
_PARTITIONS = """
    SELECT c.relname FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    JOIN pg_class p ON p.oid = i.inhparent
    JOIN pg_namespace n ON n.oid = p.relnamespace
    WHERE n.nspname = 'telemetry' AND p.relname = 'request_records'
"""


_RowId = tuple[str, SliceKey, int]
"""A rollup row: (replica_id, slice, bucket_ms)."""


class _RowCache:
    """Decoded rollup rows by (row, version), least recently used first out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._rows: OrderedDict[_RowId, tuple[int, Summary]] = OrderedDict()

    def get(self, rid: _RowId, version: int) -> Summary | None:
        hit = self._rows.get(rid)
        if hit is None or hit[0] != version:
            return None
        self._rows.move_to_end(rid)
        return hit[1]

    def put(self, rid: _RowId, version: int, summary: Summary) -> None:
        self._rows[rid] = (version, summary)
        self._rows.move_to_end(rid)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)


class RecordStore:
    """``partition_ms``/``retention_ms``/``ahead``: see :mod:`.partitions`;
    ``rollup_retention_ms``: rollup rows older than that are deleted by :meth:`maintain`;
    ``cache_rows``: decoded rollup rows kept for queries (least recently used dropped)."""

    def __init__(
        self,
        url: str,
        *,
        partition_ms: int,
        retention_ms: int,
        rollup_retention_ms: int,
        ahead: int,
        accuracy: float,
        cache_rows: int = 20_000,
    ) -> None:
        self._conninfo = to_libpq_url(url)
        self.partition_ms = partition_ms
        self.retention_ms = retention_ms
        self.rollup_retention_ms = rollup_retention_ms
        self.ahead = ahead
        self.accuracy = accuracy
        self._conns: dict[str, Conn] = {}
        self._locks = {"write": asyncio.Lock(), "read": asyncio.Lock()}
        self._partitions: set[int] = set()
        self._cache = _RowCache(cache_rows)

    # ------------------------------------------------------------------ connections

    @contextlib.asynccontextmanager
    async def _use(self, which: str) -> AsyncIterator[Conn]:
        async with self._locks[which]:
            conn = self._conns.get(which)
            if conn is None or conn.closed or conn.broken:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=(which == "read")
                )
                self._conns[which] = conn
            try:
                yield conn
            except BaseException:
                if conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await conn.rollback()
                raise

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Cursor]:
        """A write transaction (committed when the block exits cleanly)."""
        async with self._use("write") as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    async def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(psycopg.Error):
                await conn.close()
        self._conns.clear()

    # ------------------------------------------------------------------ writes

    async def ensure_partitions(self, finish_ms: Iterable[int]) -> None:
        """Create the partitions holding these finish times that this store has not seen."""
        starts = {partitions.partition_start(t, self.partition_ms) for t in finish_ms}
        missing = sorted(starts - self._partitions)
        if not missing:
            return
        async with self._use("write") as conn:
            await conn.set_autocommit(True)
            try:
                for start in missing:
                    await self._create_partition(conn, start)
            finally:
                await conn.set_autocommit(False)

    async def _create_partition(self, conn: Conn, start: int) -> None:
        stmt = sql.SQL(
            "CREATE TABLE IF NOT EXISTS telemetry.{} PARTITION OF telemetry.request_records "
            "FOR VALUES FROM ({}) TO ({})"
        ).format(
            sql.Identifier(partitions.partition_name(start)),
            sql.Literal(start),
            sql.Literal(start + self.partition_ms),
        )
        try:
            await conn.execute(stmt)
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # another replica created it at the same moment
        self._partitions.add(start)

    @staticmethod
    async def insert_new(cur: Cursor, records: Sequence[events_pb2.RequestRecord]) -> list[int]:
        """In the caller's transaction: register the ids in the ledger, COPY the records
        whose id was new; returns their indices in ``records``."""
        if not records:
            return []
        await cur.execute(
            _LEDGER, ([r.request_id for r in records], [r.finish_ms for r in records])
        )
        fresh = {str(row[0]) for row in await cur.fetchall()}
        new = [i for i, r in enumerate(records) if r.request_id in fresh]
        if new:
            async with cur.copy(_COPY) as copy:
                copy.set_types(list(_RECORD_TYPES))
                for i in new:
                    r = records[i]
                    await copy.write_row(
                        (
                            r.request_id,
                            r.finish_ms,
                            r.arrival_ms,
                            r.deployment,
                            r.tenant,
                            r.slo_class,
                            r.session_id,
                            r.outcome,
                            r.SerializeToString(),
                        )
                    )
        return new

    async def fetch_rollups(
        self, cur: Cursor, replica_id: str, keys: Iterable[BucketKey]
    ) -> dict[BucketKey, Bucket]:
        """In the caller's transaction: this replica's rows for ``keys`` (locked)."""
        out: dict[BucketKey, Bucket] = {}
        for key, start in keys:
            await cur.execute(
                "SELECT data FROM telemetry.rollups WHERE replica_id = %s AND bucket_ms = %s "
                "AND deployment = %s AND role = %s AND slo_class = %s AND tenant = %s FOR UPDATE",
                (replica_id, start, key.deployment, key.role, key.slo_class, key.tenant),
            )
            row = await cur.fetchone()
            if row is not None:
                out[(key, start)] = decode_bucket(_bytes(row[0]))[0].bucket()
        return out

    async def upsert_rollups(
        self, cur: Cursor, replica_id: str, rows: Mapping[BucketKey, Bucket], now_ms: int
    ) -> None:
        """In the caller's transaction: replace this replica's rows for ``rows``' keys."""
        params = [
            (
                replica_id,
                start,
                key.deployment,
                key.role,
                key.slo_class,
                key.tenant,
                encode_bucket(b, self.accuracy),
                now_ms,
            )
            for (key, start), b in rows.items()
        ]
        if params:
            await cur.executemany(_UPSERT, params)

    async def maintain(self, now_ms: int) -> dict[str, int]:
        """Create the partitions due, drop expired ones, delete expired ledger and rollup
        rows; returns what it did (counts)."""
        due = partitions.needed(now_ms, self.partition_ms, self.retention_ms, self.ahead)
        async with self._use("write") as conn:
            await conn.set_autocommit(True)
            try:
                existing = {
                    s
                    for (name,) in await (await conn.execute(_PARTITIONS)).fetchall()
                    if (s := partitions.parse_name(str(name))) is not None
                }
                self._partitions = set(existing)
                created = 0
                for start in due:
                    if start not in existing:
                        await self._create_partition(conn, start)
                        created += 1
                old = partitions.droppable(existing, now_ms, self.partition_ms, self.retention_ms)
                for start in old:
                    name = sql.Identifier(partitions.partition_name(start))
                    await conn.execute(sql.SQL("DROP TABLE IF EXISTS telemetry.{}").format(name))
                    self._partitions.discard(start)
                ids = await conn.execute(
                    "DELETE FROM telemetry.request_ids WHERE finish_ms < %s",
                    (now_ms - self.retention_ms,),
                )
                rollups = await conn.execute(
                    "DELETE FROM telemetry.rollups WHERE bucket_ms < %s",
                    (now_ms - self.rollup_retention_ms,),
                )
            finally:
                await conn.set_autocommit(False)
        return {
            "created": created,
            "dropped": len(old),
            "ids_deleted": max(ids.rowcount, 0),
            "rollups_deleted": max(rollups.rowcount, 0),
        }

    # ------------------------------------------------------------------ reads

    async def read_rollups(
        self,
        start_ms: int,
        end_ms: int,
        filters: Filters,
        *,
        replica_id: str | None = None,
        exclude_replica: str | None = None,
    ) -> list[tuple[BucketKey, Summary]]:
        """Rows with ``bucket_ms`` in ``[start_ms, end_ms)`` passing ``filters`` (all replicas,
        one, or all but one). Decoded rows are cached by (row, version): a query first lists
        the rows and their versions, then fetches only the rows it has not decoded yet (a
        closed minute is decoded once, not on every query)."""
        if start_ms >= end_ms:
            return []
        where = ["bucket_ms >= %s", "bucket_ms < %s"]
        params: list[object] = [start_ms, end_ms]
        for column in ("deployment", "role", "slo_class", "tenant"):
            value = getattr(filters, column)
            if value:
                where.append(f"{column} = %s")
                params.append(value)
        if replica_id is not None:
            where.append("replica_id = %s")
            params.append(replica_id)
        if exclude_replica is not None:
            where.append("replica_id <> %s")
            params.append(exclude_replica)
        listing = (
            "SELECT replica_id, deployment, role, slo_class, tenant, bucket_ms, version "
            "FROM telemetry.rollups WHERE " + " AND ".join(where)
        )
        async with self._use("read") as conn:
            rows = await (await conn.execute(listing, params)).fetchall()
            wanted: list[tuple[_RowId, int]] = []
            for rep, dep, role, cls, tenant, bucket, version in rows:
                rid = (str(rep), SliceKey(str(dep), str(role), str(cls), str(tenant)), _int(bucket))
                wanted.append((rid, _int(version)))
            hits = {rid: self._cache.get(rid, v) for rid, v in wanted}
            missing = [rid for rid, hit in hits.items() if hit is None]
            # a row rewritten between the two queries comes back in its newer version
            fetched = await self._fetch_rows(conn, missing) if missing else {}
        out: list[tuple[BucketKey, Summary]] = []
        for rid, _version in wanted:
            summary = hits[rid] or fetched.get(rid)
            if summary is not None:  # None only if deleted (retention) in between
                out.append(((rid[1], rid[2]), summary))
        return out

    async def _fetch_rows(self, conn: Conn, ids: Sequence[_RowId]) -> dict[_RowId, Summary]:
        query = (
            "SELECT r.replica_id, r.deployment, r.role, r.slo_class, r.tenant, r.bucket_ms, "
            "r.version, r.data FROM telemetry.rollups r JOIN unnest("
            "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::int8[]) "
            "AS k(replica_id, deployment, role, slo_class, tenant, bucket_ms) "
            "USING (replica_id, deployment, role, slo_class, tenant, bucket_ms)"
        )
        columns = (
            [i[0] for i in ids],
            [i[1].deployment for i in ids],
            [i[1].role for i in ids],
            [i[1].slo_class for i in ids],
            [i[1].tenant for i in ids],
            [i[2] for i in ids],
        )
        rows = await (await conn.execute(query, columns)).fetchall()
        out: dict[_RowId, Summary] = {}
        for rep, dep, role, cls, tenant, bucket, version, data in rows:
            rid = (str(rep), SliceKey(str(dep), str(role), str(cls), str(tenant)), _int(bucket))
            out[rid] = decode_bucket(_bytes(data))[0]
            self._cache.put(rid, _int(version), out[rid])
        return out

    async def has_other_replicas(self, replica_id: str, since_ms: int) -> bool:
        """Whether a replica other than ``replica_id`` has rollup rows from ``since_ms`` on."""
        async with self._use("read") as conn:
            cur = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM telemetry.rollups WHERE bucket_ms >= %s "
                "AND replica_id <> %s)",
                (since_ms, replica_id),
            )
            row = await cur.fetchone()
        return bool(row and row[0])

    async def session(
        self, session_id: str, limit: int, tenant: str = ""
    ) -> list[events_pb2.RequestRecord]:
        """A session's records in arrival order (the most recent ``limit``; 0 = all), only
        ``tenant``'s when it is set."""
        scope = " AND tenant = %s" if tenant else ""
        query = (
            "SELECT record FROM telemetry.request_records WHERE session_id = %s AND "
            f"session_id <> ''{scope} ORDER BY arrival_ms DESC, request_id DESC"
        )
        params: list[object] = [session_id, *([tenant] if tenant else [])]
        if limit > 0:
            query += " LIMIT %s"
            params.append(limit)
        async with self._use("read") as conn:
            rows = await (await conn.execute(query, params)).fetchall()
        return [events_pb2.RequestRecord.FromString(_bytes(r[0])) for r in reversed(rows)]


def _bytes(value: object) -> bytes:
    """A bytea column's value (psycopg returns bytes, or memoryview for binary results)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"expected bytea, got {type(value).__name__}")


def _int(value: object) -> int:
    if isinstance(value, int):
        return value
    raise TypeError(f"expected an integer, got {type(value).__name__}")
