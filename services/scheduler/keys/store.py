"""The API keys in Postgres (table ``scheduler.api_keys``; revision 0003).

Used by the gateway (:meth:`KeyStore.by_hash`, through :class:`~.cache.KeyCache`) and by
``tideserve keys`` (create, list, revoke). Only hashes are stored; :meth:`KeyStore.create`
returns the secret once.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from services.common import db
from services.scheduler.keys.model import ApiKey, check_tenant_name, hash_key, new_key
from services.scheduler.models import ApiKeyRow

__all__ = ["AmbiguousKey", "KeyStore"]

_T: sa.Table = ApiKeyRow.__table__  # type: ignore[assignment]


class AmbiguousKey(ValueError):
    """A prefix that names more than one key."""


def _key(row: sa.Row[tuple[object, ...]]) -> ApiKey:
    m = row._mapping
    revoked = m["revoked_at"]
    return ApiKey(
        key_id=str(m["key_id"]),
        prefix=str(m["prefix"]),
        tenant=str(m["tenant"]),
        slo_classes=tuple(m["slo_classes"] or ()),
        rpm=m["rpm"],
        tpm=m["tpm"],
        name=str(m["name"]),
        created_at=m["created_at"].timestamp(),
        revoked_at=revoked.timestamp() if revoked is not None else None,
    )


_COLS = [c for c in _T.c if c.name != "key_hash"]


class KeyStore:
    """Keys in schema ``scheduler`` of ``url`` (one small connection pool)."""

    def __init__(self, url: str, *, pool_size: int = 2) -> None:
        self.engine: AsyncEngine = db.create_engine(url, "scheduler", pool_size=pool_size)

    async def close(self) -> None:
        await self.engine.dispose()

    async def create(
        self,
        tenant: str,
        *,
        slo_classes: Sequence[str] = (),
        rpm: int | None = None,
        tpm: int | None = None,
        name: str = "",
    ) -> tuple[ApiKey, str]:
        """A new live key: (its record, the secret, shown once). ValueError for a bad
        tenant name or a limit below 1."""
        check_tenant_name(tenant)
        for what, v in (("rpm", rpm), ("tpm", tpm)):
            if v is not None and v < 1:
                raise ValueError(f"{what} must be at least 1, got {v}")
        secret, prefix = new_key()
        values = {
            "key_id": "key_" + secrets.token_hex(6),
            "prefix": prefix,
            "key_hash": hash_key(secret),
            "tenant": tenant,
            "slo_classes": list(slo_classes),
            "rpm": rpm,
            "tpm": tpm,
            "name": name,
        }
        async with self.engine.begin() as conn:
            row = (await conn.execute(sa.insert(_T).values(**values).returning(*_COLS))).one()
        return _key(row), secret

    async def list(self, *, include_revoked: bool = False) -> list[ApiKey]:
        q = sa.select(*_COLS).order_by(_T.c.created_at, _T.c.key_id)
        if not include_revoked:
            q = q.where(_T.c.revoked_at.is_(None))
        async with self.engine.connect() as conn:
            return [_key(r) for r in (await conn.execute(q)).all()]

    async def revoke(self, ident: str) -> ApiKey | None:
        """Revoke the key with id or visible prefix ``ident`` (idempotent: a revoked key
        keeps its first revocation time); None when there is none; AmbiguousKey when a
        prefix names several."""
        match = sa.or_(_T.c.key_id == ident, _T.c.prefix == ident)
        async with self.engine.begin() as conn:
            rows = (await conn.execute(sa.select(_T.c.key_id).where(match))).all()
            if len(rows) > 1:
                raise AmbiguousKey(f"{ident!r} names {len(rows)} keys; use the key id")
            if not rows:
                return None
            kid = rows[0][0]
            await conn.execute(
                sa.update(_T)
                .where(_T.c.key_id == kid, _T.c.revoked_at.is_(None))
                .values(revoked_at=datetime.now(UTC))
            )
            row = (await conn.execute(sa.select(*_COLS).where(_T.c.key_id == kid))).one()
        return _key(row)

    async def by_hash(self, digest: bytes) -> ApiKey | None:
        """The key (live or revoked) whose secret hashes to ``digest``, or None."""
        q = sa.select(*_COLS).where(_T.c.key_hash == digest)
        async with self.engine.connect() as conn:
            row = (await conn.execute(q)).one_or_none()
        return _key(row) if row is not None else None
