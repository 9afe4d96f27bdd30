"""Postgres storage of the autoscaler: specs with revisions, desired replicas, decisions.

``apply`` is idempotent: an equal spec (compared as validated domain objects, generation
ignored) keeps its generation; a changed one becomes generation + 1 and every revision is
kept in ``deployment_revisions``. Desired replicas start at the spec's ``replicas``; a
changed spec keeps the desired count of an existing role clamped into its new [min, max]
(the planner owns the count, as with an autoscaled RoleBasedGroup). Manual pins
(``tideserve scale``: ``{role: replicas}`` the planner holds) are cleared by a changed apply.
Decisions outlive their deployment (an audit log).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from tideserve.v1 import common_pb2

from services.autoscaler.models import Decision, Deployment, DeploymentRevision
from services.autoscaler.translate import spec_from_proto, spec_to_proto
from services.common.planner.records import DecisionRecord, RoleChange
from services.common.planner.spec import DeploymentSpec

__all__ = ["AutoscalerStore", "StoredDeployment", "merge_desired"]


@dataclass(frozen=True)
class StoredDeployment:
    spec: DeploymentSpec
    desired: Mapping[str, int]
    pins: Mapping[str, int] = field(default_factory=dict)


def _ints(d: Mapping[str, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in d.items()}


def _stored(row: Any) -> StoredDeployment:
    spec = _decode(row.spec).model_copy(update={"generation": row.generation})
    return StoredDeployment(spec, _ints(row.desired), _ints(row.pins))


def merge_desired(spec: DeploymentSpec, old: Mapping[str, int]) -> dict[str, int]:
    """Desired replicas for ``spec`` given the previous ones (pure; rule in the module doc)."""
    out: dict[str, int] = {}
    for role in spec.roles:
        if role.name in old:
            out[role.name] = min(role.max_replicas, max(role.min_replicas, old[role.name]))
        else:
            out[role.name] = role.replicas
    return out


def _encode(spec: DeploymentSpec) -> bytes:
    return spec_to_proto(spec).SerializeToString(deterministic=True)


def _decode(blob: bytes) -> DeploymentSpec:
    msg = common_pb2.DeploymentSpec()
    msg.ParseFromString(blob)
    return spec_from_proto(msg)


def _record(row: Any) -> DecisionRecord:
    return DecisionRecord(
        decision_id=row.decision_id,
        deployment=row.deployment,
        generation=int(row.generation),
        ts_ms=int(row.ts_ms),
        changes=tuple(RoleChange(c["role"], c["from"], c["to"]) for c in row.changes),
        reasons=tuple(row.reasons),
        binding_constraint=row.binding_constraint,
        status=row.status,
        victims=tuple(row.victims),
        inputs=dict(row.inputs),
        forecast=dict(row.forecast),
    )


_DEP = cast(sa.Table, Deployment.__table__)
_REV = cast(sa.Table, DeploymentRevision.__table__)
_DEC = cast(sa.Table, Decision.__table__)
_SELECT = sa.select(_DEP.c.spec, _DEP.c.generation, _DEP.c.desired, _DEP.c.pins)


class AutoscalerStore:
    """Async access to the autoscaler schema (one short transaction per call)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def apply(self, spec: DeploymentSpec) -> tuple[DeploymentSpec, bool]:
        """Store ``spec``; returns (the stored spec with its generation, changed?)."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    sa.select(_DEP.c.spec, _DEP.c.generation, _DEP.c.desired)
                    .where(_DEP.c.name == spec.name)
                    .with_for_update()
                )
            ).first()
            if row is not None:
                current = _decode(row.spec).model_copy(update={"generation": row.generation})
                if current.model_copy(update={"generation": 0}) == spec.model_copy(
                    update={"generation": 0}
                ):
                    return current, False
            generation = 1 if row is None else int(row.generation) + 1
            stored = spec.model_copy(update={"generation": generation})
            blob = _encode(stored)
            desired = merge_desired(stored, {} if row is None else dict(row.desired))
            upsert = insert(_DEP).values(
                name=spec.name, spec=blob, generation=generation, desired=desired
            )
            await conn.execute(
                upsert.on_conflict_do_update(
                    index_elements=[_DEP.c.name],
                    set_={
                        "spec": blob,
                        "generation": generation,
                        "desired": desired,
                        "pins": {},
                        "updated_at": sa.func.now(),
                    },
                )
            )
            await conn.execute(
                sa.insert(_REV).values(name=spec.name, generation=generation, spec=blob)
            )
            return stored, True

    async def get(self, name: str) -> StoredDeployment | None:
        async with self._engine.connect() as conn:
            return await self._get(conn, name)

    async def _get(self, conn: AsyncConnection, name: str) -> StoredDeployment | None:
        row = (await conn.execute(_SELECT.where(_DEP.c.name == name))).first()
        return None if row is None else _stored(row)

    async def all(self) -> list[StoredDeployment]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(_SELECT.order_by(_DEP.c.name))).all()
        return [_stored(r) for r in rows]

    async def revisions(self, name: str) -> list[DeploymentSpec]:
        """Every stored revision of ``name``, oldest first."""
        async with self._engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.select(_REV.c.spec, _REV.c.generation)
                    .where(_REV.c.name == name)
                    .order_by(_REV.c.generation)
                )
            ).all()
        return [_decode(r.spec).model_copy(update={"generation": r.generation}) for r in rows]

    async def delete(self, name: str) -> bool:
        """Remove ``name`` and its revisions; False if it did not exist."""
        async with self._engine.begin() as conn:
            result = await conn.execute(sa.delete(_DEP).where(_DEP.c.name == name))
        return bool(result.rowcount)

    async def set_desired(self, name: str, targets: Mapping[str, int]) -> None:
        """Merge ``targets`` into the desired replicas of ``name`` (no-op if it is gone)."""
        async with self._engine.begin() as conn:
            await conn.execute(
                sa.update(_DEP)
                .where(_DEP.c.name == name)
                .values(
                    desired=_DEP.c.desired.op("||")(sa.cast(dict(targets), _DEP.c.desired.type))
                )
            )

    async def add_decision(self, record: DecisionRecord) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(
                sa.insert(_DEC).values(
                    decision_id=record.decision_id,
                    deployment=record.deployment,
                    generation=record.generation,
                    ts_ms=record.ts_ms,
                    changes=[
                        {"role": c.role, "from": c.from_replicas, "to": c.to_replicas}
                        for c in record.changes
                    ],
                    victims=list(record.victims),
                    reasons=list(record.reasons),
                    binding_constraint=record.binding_constraint,
                    status=record.status,
                    inputs=dict(record.inputs),
                    forecast=dict(record.forecast),
                )
            )

    async def set_status(self, decision_id: str, status: str, reason: str = "") -> None:
        """Update a decision's status, appending ``reason`` when given."""
        values: dict[str, Any] = {"status": status}
        if reason:
            values["reasons"] = _DEC.c.reasons.op("||")(sa.cast([reason], _DEC.c.reasons.type))
        async with self._engine.begin() as conn:
            await conn.execute(
                sa.update(_DEC).where(_DEC.c.decision_id == decision_id).values(**values)
            )

    async def decisions(self, name: str = "", limit: int = 20) -> list[DecisionRecord]:
        """Decisions of ``name`` ("" = all), newest first."""
        query = sa.select(_DEC).order_by(_DEC.c.ts_ms.desc(), _DEC.c.id.desc()).limit(limit)
        if name:
            query = query.where(_DEC.c.deployment == name)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [_record(r) for r in rows]

    async def names(self) -> Sequence[str]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(sa.select(_DEP.c.name).order_by(_DEP.c.name))).all()
        return [str(r.name) for r in rows]

    async def set_pin(self, name: str, role: str, replicas: int | None) -> None:
        """Pin ``role`` of ``name`` at ``replicas`` (None: release it; no-op if it is gone)."""
        pins = _DEP.c.pins
        value = (
            pins.op("-")(role)
            if replicas is None
            else pins.op("||")(sa.cast({role: replicas}, pins.type))
        )
        async with self._engine.begin() as conn:
            await conn.execute(sa.update(_DEP).where(_DEP.c.name == name).values(pins=value))
