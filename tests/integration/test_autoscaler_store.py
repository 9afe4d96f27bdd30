"""Specs, revisions, desired replicas and decisions in real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.autoscaler.store import AutoscalerStore
from services.common.db import create_engine, migrate
from services.common.planner.records import DecisionRecord, RoleChange
from services.common.planner.spec import load_spec_file

pytestmark = pytest.mark.integration

PD = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "pd.yaml"


@pytest.fixture
async def store(postgres_db_url: str) -> AsyncIterator[AutoscalerStore]:
    await asyncio.to_thread(migrate, postgres_db_url, "autoscaler")
    engine = create_engine(postgres_db_url, "autoscaler")
    try:
        yield AutoscalerStore(engine)
    finally:
        await engine.dispose()


async def test_apply_is_idempotent_and_changes_make_revisions(store: AutoscalerStore) -> None:
    spec = load_spec_file(PD.read_text())
    first, changed = await store.apply(spec)
    assert (first.generation, changed) == (1, True)
    again, changed = await store.apply(spec)
    assert (again.generation, changed) == (1, False)

    bigger = spec.model_copy(update={"model": "other"})
    second, changed = await store.apply(bigger)
    assert (second.generation, changed) == (2, True)
    revisions = await store.revisions(spec.name)
    assert [(r.generation, r.model) for r in revisions] == [(1, spec.model), (2, "other")]
    got = await store.get(spec.name)
    assert got is not None and got.spec == second
    assert got.desired == {"prefill": 1, "decode": 1}


async def test_desired_survives_a_spec_change_clamped(store: AutoscalerStore) -> None:
    spec = load_spec_file(PD.read_text())
    await store.apply(spec)
    await store.set_desired(spec.name, {"prefill": 5})
    roles = list(spec.roles)
    roles[0] = roles[0].model_copy(update={"max_replicas": 3})
    await store.apply(spec.model_copy(update={"roles": tuple(roles)}))
    got = await store.get(spec.name)
    assert got is not None and got.desired == {"prefill": 3, "decode": 1}


async def test_decisions_are_stored_newest_first_and_outlive_delete(
    store: AutoscalerStore,
) -> None:
    spec = load_spec_file(PD.read_text())
    await store.apply(spec)
    for i in range(3):
        await store.add_decision(
            DecisionRecord(
                decision_id=f"d{i}",
                deployment=spec.name,
                generation=1,
                ts_ms=1000 * i,
                changes=(RoleChange("prefill", 1, 1 + i),),
                reasons=(f"reason {i}",),
                binding_constraint="prefill:ttft:interactive",
                status="planned",
                victims=("p-1",) if i else (),
                inputs={"rate_rps": 1.5 * i},
                forecast={"predictor": "holt_winters", "rate_rps": 2.0},
            )
        )
    await store.set_status("d2", "failed", "reconciler: driver error")
    got = await store.decisions(spec.name, limit=2)
    assert [d.decision_id for d in got] == ["d2", "d1"]
    assert got[0].status == "failed"
    assert got[0].reasons == ("reason 2", "reconciler: driver error")
    assert got[0].changes == (RoleChange("prefill", 1, 3),)
    assert got[0].inputs == {"rate_rps": 3.0} and got[1].victims == ("p-1",)
    assert await store.delete(spec.name) is True
    assert await store.delete(spec.name) is False
    assert await store.get(spec.name) is None
    assert await store.revisions(spec.name) == []
    assert len(await store.decisions(spec.name)) == 3
