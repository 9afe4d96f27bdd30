"""Postgres persistence of kvmeta: prefix-index checkpoints and object-master rows.

Tables (schema ``kvmeta``): ``index_checkpoints`` (one snapshot per deployment with the
id of the last stream entry it covers), ``segments`` and ``objects`` (revision 0002).
Every method is one transaction; errors propagate (SQLAlchemy / psycopg exceptions).
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from services.kvmeta.objects import Changes, ObjectState, SegmentSpec

__all__ = ["KVMetaStore"]

_LATEST = sa.text(
    "SELECT DISTINCT ON (deployment) deployment, stream_id, snapshot "
    "FROM kvmeta.index_checkpoints ORDER BY deployment, id DESC"
)
_INSERT_CP = sa.text(
    "INSERT INTO kvmeta.index_checkpoints (deployment, stream_id, snapshot) "
    "VALUES (:d, :s, :b) RETURNING id"
)
_PRUNE_CP = sa.text("DELETE FROM kvmeta.index_checkpoints WHERE deployment = :d AND id < :id")
_UPSERT_SEG = sa.text(
    "INSERT INTO kvmeta.segments (deployment, name, instance_id, tier, capacity_bytes, "
    "transfer_address, base_address) VALUES (:d, :n, :i, :t, :c, :a, :b) "
    "ON CONFLICT (deployment, name) DO UPDATE SET instance_id = EXCLUDED.instance_id, "
    "tier = EXCLUDED.tier, capacity_bytes = EXCLUDED.capacity_bytes, "
    "transfer_address = EXCLUDED.transfer_address, base_address = EXCLUDED.base_address"
)
_DELETE_SEG = sa.text("DELETE FROM kvmeta.segments WHERE deployment = :d AND name = :n")
_UPSERT_OBJ = sa.text(
    "INSERT INTO kvmeta.objects (deployment, tenant, key, size, status, replicas, soft_pin, "
    "hard_pin, started_at) VALUES (:d, :t, :k, :s, :st, CAST(:r AS jsonb), :sp, :hp, :sa) "
    "ON CONFLICT (deployment, tenant, key) DO UPDATE SET size = EXCLUDED.size, "
    "status = EXCLUDED.status, replicas = EXCLUDED.replicas, soft_pin = EXCLUDED.soft_pin, "
    "hard_pin = EXCLUDED.hard_pin, started_at = EXCLUDED.started_at, updated_at = now()"
)
_DELETE_OBJ = sa.text(
    "DELETE FROM kvmeta.objects WHERE deployment = :d AND tenant = :t AND key = :k"
)


class KVMetaStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    # ------------------------------------------------------------ checkpoints

    async def latest_checkpoints(self) -> dict[str, tuple[str, bytes]]:
        """deployment -> (stream id covered, snapshot bytes) of its newest checkpoint."""
        async with self._engine.connect() as conn:
            rows = (await conn.execute(_LATEST)).all()
        return {str(d): (str(s), bytes(b)) for d, s, b in rows}

    async def save_checkpoint(self, deployment: str, stream_id: str, snapshot: bytes) -> None:
        """Insert a checkpoint and delete the older ones of that deployment (atomically)."""
        async with self._engine.begin() as conn:
            new_id = (
                await conn.execute(_INSERT_CP, {"d": deployment, "s": stream_id, "b": snapshot})
            ).scalar_one()
            await conn.execute(_PRUNE_CP, {"d": deployment, "id": new_id})

    # ---------------------------------------------------------------- objects

    async def load_objects(self) -> tuple[list[tuple[str, SegmentSpec]], list[ObjectState]]:
        async with self._engine.connect() as conn:
            segs = (
                await conn.execute(
                    sa.text(
                        "SELECT deployment, name, instance_id, tier, capacity_bytes, "
                        "transfer_address, base_address FROM kvmeta.segments"
                    )
                )
            ).all()
            objs = (
                await conn.execute(
                    sa.text(
                        "SELECT deployment, tenant, key, size, status, replicas, soft_pin, "
                        "hard_pin, started_at FROM kvmeta.objects"
                    )
                )
            ).all()
        segments = [
            (str(d), SegmentSpec(str(n), str(i), int(t), int(c), str(a), int(b)))
            for d, n, i, t, c, a, b in segs
        ]
        objects = [
            ObjectState(
                str(d),
                str(t),
                str(k),
                int(s),
                str(st),
                [
                    (str(r[0]), int(r[1]))
                    for r in (reps if isinstance(reps, list) else json.loads(reps))
                ],
                bool(sp),
                bool(hp),
                float(sa_),
            )
            for d, t, k, s, st, reps, sp, hp, sa_ in objs
        ]
        return segments, objects

    async def save_changes(self, changes: Changes) -> None:
        """Apply the rows changed since the last drain in one transaction."""
        seg_up = [
            _seg_row(d, spec) for (d, _), spec in changes.segments.items() if spec is not None
        ]
        seg_del = [{"d": d, "n": n} for (d, n), spec in changes.segments.items() if spec is None]
        obj_up = [_obj_row(o) for o in changes.objects.values() if o is not None]
        obj_del = [
            {"d": d, "t": t, "k": k} for (d, t, k), o in changes.objects.items() if o is None
        ]
        if not (seg_up or seg_del or obj_up or obj_del):
            return
        async with self._engine.begin() as conn:
            for stmt, rows in (
                (_UPSERT_SEG, seg_up),
                (_DELETE_OBJ, obj_del),
                (_UPSERT_OBJ, obj_up),
                (_DELETE_SEG, seg_del),
            ):
                if rows:
                    await conn.execute(stmt, rows)


def _seg_row(deployment: str, s: SegmentSpec) -> dict[str, object]:
    return {
        "d": deployment,
        "n": s.name,
        "i": s.instance_id,
        "t": s.tier,
        "c": s.capacity_bytes,
        "a": s.transfer_address,
        "b": s.base_address,
    }


def _obj_row(o: ObjectState) -> dict[str, object]:
    return {
        "d": o.deployment,
        "t": o.tenant,
        "k": o.key,
        "s": o.size,
        "st": o.status,
        "r": json.dumps([[seg, off] for seg, off in o.replicas]),
        "sp": o.soft_pin,
        "hp": o.hard_pin,
        "sa": o.started_at,
    }
