"""kvmeta's agent sessions over gRPC against real Postgres: turns, placement, tenants, errors,
durability across a restart, expiry that deletes the row."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import pytest
from tideserve.v1 import common_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common import db
from services.common.clock import ManualClock
from services.common.sessions import SessionTable, ToolTimePredictor
from services.kvmeta.sessions import SessionShell, SessionStore
from tests.helpers.kvmeta import serve_sessions

pytestmark = pytest.mark.integration

GPU, CPU = common_pb2.TIER_GPU, common_pb2.TIER_CPU
IDLE_TIMEOUT_S, RETENTION_S = 600.0, 60.0


@dataclass
class Kv:
    stub: kvmeta_pb2_grpc.KVMetaServiceStub
    shell: SessionShell


@asynccontextmanager
async def kvmeta(pg_url: str, clock: ManualClock) -> AsyncIterator[Kv]:
    await asyncio.to_thread(db.migrate, pg_url, "kvmeta")
    engine = db.create_engine(pg_url, "kvmeta")
    table = SessionTable(
        ToolTimePredictor(default_gap_s=30.0),
        idle_timeout_s=IDLE_TIMEOUT_S,
        ended_retention_s=RETENTION_S,
    )
    shell = SessionShell(table, SessionStore(engine), clock.now)
    await shell.load()
    try:
        async with serve_sessions(shell) as (_, stub):
            yield Kv(stub, shell)
    finally:
        await engine.dispose()


def key(tenant: str = "alice", sid: str = "s1") -> dict[str, str]:
    return {"deployment": "d", "tenant": tenant, "session_id": sid}


async def test_sessions_turns_placement_tenants_and_restart(postgres_db_url: str) -> None:
    clock = ManualClock(1_000_000.0)
    async with kvmeta(postgres_db_url, clock) as kv:
        s = (
            await kv.stub.StartSessionTurn(
                kvmeta_pb2.StartSessionTurnRequest(**key(), agent="claude-code", home_instance="e1")
            )
        ).session
        assert (s.phase, s.turns, s.home_instance) == (kvmeta_pb2.SESSION_PHASE_ACTIVE, 1, "e1")
        clock.advance(2.0)
        s = (
            await kv.stub.EndSessionTurn(
                kvmeta_pb2.EndSessionTurnRequest(
                    **key(), tip_block_hash=2**63 + 5, tip_tokens=4096, tool_names=["bash", "read"]
                )
            )
        ).session
        assert s.phase == kvmeta_pb2.SESSION_PHASE_IDLE
        assert list(s.tool_names) == ["bash", "read"]
        assert (s.prediction_source, s.prediction_samples) == ("default", 0)
        assert s.predicted_return_ms == int((clock.now() + 30.0) * 1000)
        placed = kvmeta_pb2.SetSessionPlacementRequest(
            **key(),
            home_instance="e2",
            tiers=[
                kvmeta_pb2.TierMatch(tier=CPU, blocks=4),
                kvmeta_pb2.TierMatch(tier=GPU, blocks=60),
            ],
        )
        s = (await kv.stub.SetSessionPlacement(placed)).session
        assert [(t.tier, t.blocks) for t in s.tiers] == [(GPU, 60), (CPU, 4)]
        # another tenant never sees alice's session, even by its id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kv.stub.GetAgentSession(kvmeta_pb2.GetAgentSessionRequest(**key("bob")))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await kv.stub.ListAgentSessions(
            kvmeta_pb2.ListAgentSessionsRequest(deployment="d", tenant="bob")
        )
        assert list(listed.sessions) == []
        before = (await kv.stub.GetAgentSession(kvmeta_pb2.GetAgentSessionRequest(**key()))).session
        assert before.tip_block_hash == 2**63 + 5
    # a fresh kvmeta on the same database serves the same session
    async with kvmeta(postgres_db_url, clock) as kv:
        after = (await kv.stub.GetAgentSession(kvmeta_pb2.GetAgentSessionRequest(**key()))).session
        assert after == before
        idle = await kv.stub.ListAgentSessions(
            kvmeta_pb2.ListAgentSessionsRequest(
                deployment="d", tenant="alice", phase=kvmeta_pb2.SESSION_PHASE_IDLE
            )
        )
        assert [x.session_id for x in idle.sessions] == ["s1"]
        # the next turn 12 s later is a gap observation kept in the session's row
        clock.advance(12.0)
        await kv.stub.StartSessionTurn(kvmeta_pb2.StartSessionTurnRequest(**key()))
        assert kv.shell.table.get(("d", "alice", "s1")).recent_gaps == (12.0,)


@pytest.mark.parametrize(
    ("call", "request_", "code"),
    [
        (
            "StartSessionTurn",
            kvmeta_pb2.StartSessionTurnRequest(deployment="d"),
            "INVALID_ARGUMENT",
        ),
        (
            "EndSessionTurn",
            kvmeta_pb2.EndSessionTurnRequest(**key(), tip_tokens=-1),
            "INVALID_ARGUMENT",
        ),
        ("SetSessionPlacement", kvmeta_pb2.SetSessionPlacementRequest(**key()), "NOT_FOUND"),
        ("EndAgentSession", kvmeta_pb2.EndAgentSessionRequest(**key()), "NOT_FOUND"),
        ("ListAgentSessions", kvmeta_pb2.ListAgentSessionsRequest(), "INVALID_ARGUMENT"),
    ],
    ids=[
        "no-session-id",
        "negative-tokens",
        "placement-unknown",
        "end-unknown",
        "list-no-deployment",
    ],
)
async def test_session_rpc_errors(
    postgres_db_url: str, call: str, request_: object, code: str
) -> None:
    async with kvmeta(postgres_db_url, ManualClock(1000.0)) as kv:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await getattr(kv.stub, call)(request_)
        assert err.value.code() == getattr(grpc.StatusCode, code)


async def test_unspecified_tier_is_refused(postgres_db_url: str) -> None:
    async with kvmeta(postgres_db_url, ManualClock(1000.0)) as kv:
        await kv.stub.StartSessionTurn(kvmeta_pb2.StartSessionTurnRequest(**key()))
        bad = kvmeta_pb2.SetSessionPlacementRequest(
            **key(), tiers=[kvmeta_pb2.TierMatch(tier=common_pb2.TIER_UNSPECIFIED, blocks=1)]
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kv.stub.SetSessionPlacement(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_expiry_ends_then_deletes_the_row(postgres_db_url: str) -> None:
    clock = ManualClock(1000.0)
    async with kvmeta(postgres_db_url, clock) as kv:
        await kv.stub.EndSessionTurn(kvmeta_pb2.EndSessionTurnRequest(**key()))
        clock.advance(IDLE_TIMEOUT_S)
        await kv.shell.tick()
        s = (await kv.stub.GetAgentSession(kvmeta_pb2.GetAgentSessionRequest(**key()))).session
        assert s.phase == kvmeta_pb2.SESSION_PHASE_ENDED
        clock.advance(RETENTION_S)
        await kv.shell.tick()
    async with kvmeta(postgres_db_url, clock) as kv:
        assert len(kv.shell.table) == 0
