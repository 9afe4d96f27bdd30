"""Where stored responses live: the :class:`ResponseStore` interface and its Postgres
implementation (table ``scheduler.responses``, revision 0004), shared by every gateway
replica on the same database.

Times are wall-clock seconds passed in (``now``); a row whose ``expires_at`` has passed is
never returned, and :meth:`ResponseStore.sweep` deletes such rows (the gateway runs it
periodically). :meth:`~ResponseStore.chain` reads a whole ``previous_response_id`` chain in
one query (a recursive CTE); the pure :func:`~.chain.rebuild` checks it.

Items and the response object are stored as JSON text with every non-ASCII character
escaped, so NUL and lone surrogates, which any JSON string may hold and JSONB refuses, are
stored and read back unchanged.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from services.common import db
from services.scheduler.models import ResponseRow
from services.scheduler.responses.chain import StoredResponse

__all__ = ["PostgresResponseStore", "ResponseStore"]

_T: sa.Table = ResponseRow.__table__  # type: ignore[assignment]


class ResponseStore(Protocol):
    async def put(self, row: StoredResponse) -> None:
        """Store ``row`` (a new id; an existing id is an error)."""
        ...

    async def get(self, rid: str, now: float) -> StoredResponse | None:
        """The live row ``rid`` (any tenant's: the caller checks), else None."""
        ...

    async def chain(self, rid: str, now: float, max_depth: int) -> dict[str, StoredResponse]:
        """The live rows of ``rid``'s chain (at most ``max_depth`` + 1), by id."""
        ...

    async def delete(self, rid: str, tenant: str) -> bool:
        """Delete ``tenant``'s row ``rid``; whether there was one."""
        ...

    async def sweep(self, now: float) -> int:
        """Delete the rows expired at ``now``; how many."""
        ...

    async def close(self) -> None: ...


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def _row(r: sa.Row[Any]) -> StoredResponse:
    return _row_of(dict(r._mapping))


_CHAIN = sa.text(
    """
    WITH RECURSIVE chain(id, prev, depth) AS (
        SELECT id, previous_response_id, 0 FROM scheduler.responses
        WHERE id = :rid AND expires_at > :now
      UNION ALL
        SELECT r.id, r.previous_response_id, c.depth + 1
        FROM scheduler.responses r JOIN chain c ON r.id = c.prev
        WHERE c.depth < :depth AND r.expires_at > :now
    )
    SELECT r.* FROM scheduler.responses r WHERE r.id IN (SELECT id FROM chain)
    """
)


class PostgresResponseStore:
    """Stored responses in schema ``scheduler`` of ``url`` (one small connection pool;
    connections open on first use)."""

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.engine: AsyncEngine = db.create_engine(url, "scheduler", pool_size=pool_size)

    async def close(self) -> None:
        await self.engine.dispose()

    async def put(self, row: StoredResponse) -> None:
        values = {
            "id": row.id,
            "tenant": row.tenant,
            "model": row.model,
            "previous_response_id": row.previous_response_id,
            "created_at": _ts(row.created_at),
            "expires_at": _ts(row.expires_at),
            "input_items": _json(list(row.input_items)),
            "output_items": _json(list(row.output_items)),
            "response": _json(row.response),
        }
        async with self.engine.begin() as conn:
            await conn.execute(sa.insert(_T).values(**values))

    async def get(self, rid: str, now: float) -> StoredResponse | None:
        q = sa.select(_T).where(_T.c.id == rid, _T.c.expires_at > _ts(now))
        async with self.engine.connect() as conn:
            r = (await conn.execute(q)).one_or_none()
        return _row(r) if r is not None else None

    async def chain(self, rid: str, now: float, max_depth: int) -> dict[str, StoredResponse]:
        params = {"rid": rid, "now": _ts(now), "depth": max_depth}
        async with self.engine.connect() as conn:
            rows = (await conn.execute(_CHAIN, params)).all()
        out = {}
        for r in rows:
            row = _row(r)
            out[row.id] = row
        return out

    async def delete(self, rid: str, tenant: str) -> bool:
        q = sa.delete(_T).where(_T.c.id == rid, _T.c.tenant == tenant)
        async with self.engine.begin() as conn:
            return bool((await conn.execute(q)).rowcount)

    async def sweep(self, now: float) -> int:
        async with self.engine.begin() as conn:
            return int(
                (await conn.execute(sa.delete(_T).where(_T.c.expires_at <= _ts(now)))).rowcount
            )


def _row_of(m: dict[str, Any]) -> StoredResponse:
    return StoredResponse(
        id=str(m["id"]),
        tenant=str(m["tenant"]),
        model=str(m["model"]),
        created_at=m["created_at"].timestamp(),
        expires_at=m["expires_at"].timestamp(),
        previous_response_id=m["previous_response_id"],
        input_items=tuple(json.loads(m["input_items"])),
        output_items=tuple(json.loads(m["output_items"])),
        response=dict(json.loads(m["response"])),
    )
