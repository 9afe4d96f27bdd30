"""kvmeta's agent sessions: the pure :class:`SessionTable` plus write-through persistence.

Durable the way the object master is: every mutating RPC writes its changed rows to Postgres
(``kvmeta.sessions``, revision 0003) before it replies, one writer at a time and in order;
rows a failed write left behind are retried by the next write or tick. At start the table is
loaded from those rows. Expiry runs on :meth:`SessionShell.tick`.

Beside the rows, in memory only: each session's block-hash chain of its last turn
(``chains``, for the retention controller, :mod:`services.kvmeta.retention`), at most
``max_chain_blocks`` hashes each, forgotten with the session. After a restart a session has
no chain until its next turn ends (the controller leaves it alone until then).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from services.common.sessions import Phase, Session, SessionKey, SessionTable
from services.kvmeta.writethrough import WriteThrough

__all__ = ["SessionShell", "SessionStore", "session_from_json", "session_to_json"]

_UPSERT = sa.text(
    "INSERT INTO kvmeta.sessions (deployment, tenant, session_id, phase, home_instance, body) "
    "VALUES (:d, :t, :s, :p, :h, CAST(:b AS jsonb)) "
    "ON CONFLICT (deployment, tenant, session_id) DO UPDATE SET phase = EXCLUDED.phase, "
    "home_instance = EXCLUDED.home_instance, body = EXCLUDED.body, updated_at = now()"
)
_DELETE = sa.text(
    "DELETE FROM kvmeta.sessions WHERE deployment = :d AND tenant = :t AND session_id = :s"
)
_LOAD = sa.text("SELECT deployment, tenant, session_id, body FROM kvmeta.sessions")

_KEY_FIELDS = ("deployment", "tenant", "session_id")


def session_to_json(s: Session) -> str:
    """The session's fields other than its key, as a JSON object."""
    body: dict[str, Any] = {
        f: getattr(s, f) for f in Session.__dataclass_fields__ if f not in _KEY_FIELDS
    }
    body["phase"] = s.phase.value
    body["tiers"] = [list(t) for t in s.tiers]
    body["tool_names"] = list(s.tool_names)
    body["recent_gaps"] = list(s.recent_gaps)
    return json.dumps(body, separators=(",", ":"))


def session_from_json(deployment: str, tenant: str, session_id: str, body: Any) -> Session:
    """Inverse of :func:`session_to_json`; unknown keys are ignored (a newer writer)."""
    raw: Mapping[str, Any] = json.loads(body) if isinstance(body, str | bytes) else body
    known = {k: v for k, v in raw.items() if k in Session.__dataclass_fields__}
    known["phase"] = Phase(known.get("phase", Phase.ACTIVE.value))
    known["tiers"] = tuple((int(t), int(n)) for t, n in known.get("tiers", ()))
    known["tool_names"] = tuple(str(x) for x in known.get("tool_names", ()))
    known["recent_gaps"] = tuple(float(x) for x in known.get("recent_gaps", ()))
    for k in _KEY_FIELDS:
        known.pop(k, None)
    return Session(deployment, tenant, session_id, **known)


class SessionStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def load(self) -> list[Session]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(_LOAD)).all()
        return [session_from_json(str(d), str(t), str(s), b) for d, t, s, b in rows]

    async def save(self, changes: Mapping[SessionKey, Session | None]) -> None:
        """Upsert and delete the changed rows in one transaction."""
        up = [
            {
                "d": s.deployment,
                "t": s.tenant,
                "s": s.session_id,
                "p": s.phase.value,
                "h": s.home_instance,
                "b": session_to_json(s),
            }
            for s in changes.values()
            if s is not None
        ]
        gone = [{"d": d, "t": t, "s": sid} for (d, t, sid), s in changes.items() if s is None]
        if not (up or gone):
            return
        async with self._engine.begin() as conn:
            if up:
                await conn.execute(_UPSERT, up)
            if gone:
                await conn.execute(_DELETE, gone)


class SessionShell:
    """The session table plus write-through persistence (one writer at a time, in order)."""

    def __init__(
        self,
        table: SessionTable,
        store: SessionStore | None,
        wall: Callable[[], float],
        *,
        max_chain_blocks: int = 16_384,
    ) -> None:
        self.table = table
        self._store = store
        self._wall = wall
        self.persist = WriteThrough(
            table.drain_changes, table.requeue_changes, store.save if store is not None else None
        )
        self.max_chain_blocks = max_chain_blocks
        self.chains: dict[SessionKey, array[int]] = {}

    def set_chain(self, key: SessionKey, hashes: Sequence[int]) -> None:
        """The session's chain (its last ``max_chain_blocks`` hashes: the tip's end); an
        empty one keeps the last."""
        if hashes:
            self.chains[key] = array("Q", hashes[-self.max_chain_blocks :])

    def now(self) -> float:
        return self._wall()

    async def load(self) -> None:
        if self._store is not None:
            self.table.load(await self._store.load())

    async def tick(self) -> None:
        _, gone = self.table.expire(self._wall())
        for key in gone:
            self.chains.pop(key, None)
        await self.persist()
