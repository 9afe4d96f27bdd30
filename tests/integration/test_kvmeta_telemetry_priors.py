"""kvmeta's tool-time priors from a real telemetry: a ``TelemetryService`` under the service
runner with token auth, its ``ToolTimes`` fed request records, and kvmeta's session service
(in-process gRPC) whose predictor takes telemetry's distributions as priors over a channel
with kvmeta's client credentials. A fresh kvmeta predicts a session's return from the prior;
once kvmeta has seen enough gaps of its own, its own distribution wins."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common.clock import ManualClock
from services.common.security.access import Role
from services.common.security.tokens import format_entry, new_token
from services.common.server import serve
from services.common.settings import ServiceSettings
from services.kvmeta.main import _sessions, _tool_priors
from services.kvmeta.sessions import SessionShell
from services.kvmeta.settings import KVMetaSettings
from services.telemetry.access import ACCESS
from services.telemetry.query import WindowQuery
from services.telemetry.servicer import TelemetryServicer
from services.telemetry.servicer import add_to_server as add_telemetry
from services.telemetry.tooltimes import ToolTimes
from services.telemetry.windows.memory import WindowMemory
from tests.helpers.kvmeta import serve_sessions
from tests.helpers.ports import free_port
from tests.helpers.records import NOW_MS, record

pytestmark = pytest.mark.integration

SESSIONS = 30  # telemetry's bash gaps: 10, 11, ... 39 s, one per session
MIN_SAMPLES = 20  # kvmeta's tool_time_min_samples (its default)
OWN_GAP_S = 5.0


def learned() -> ToolTimes:
    """Each session: a turn ending in a bash call, the next turn 10 + i s after it ended."""
    learner = ToolTimes()
    records = []
    for i in range(SESSIONS):
        first = record(
            f"{i}a", deployment="default", session_id=f"t{i}", finish_ms=NOW_MS - 100_000
        )
        first.tool_calls.add(name="bash", argument_bytes=5)
        second = record(
            f"{i}b",
            deployment="default",
            session_id=f"t{i}",
            arrival_ms=NOW_MS - 100_000 + (10 + i) * 1000,
            finish_ms=NOW_MS,
        )
        records += [first, second]
    learner.observe_records(NOW_MS, records)
    return learner


@asynccontextmanager
async def telemetry(learner: ToolTimes, tokens_file: Path) -> AsyncIterator[int]:
    """The telemetry servicer under the service runner with auth on; yields its port."""
    port = free_port()
    conf = ServiceSettings.model_validate(
        {
            "grpc_port": port,
            "log_format": "text",
            "shutdown_grace_s": 0.0,
            "auth": {"enabled": True, "tokens_file": tokens_file},
        }
    )
    query = WindowQuery(None, WindowMemory(1000, 60_000), {}, "t1", time.time)
    servicer = TelemetryServicer(query, tool_times=learner, wall=time.time)

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_telemetry(servicer, server)]

    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve(conf, "telemetry", register, ready=ready, stop=stop, access=(ACCESS,))
    )
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()
    try:
        yield port
    finally:
        stop.set()
        await task


@asynccontextmanager
async def kvmeta(shell: SessionShell) -> AsyncIterator[kvmeta_pb2_grpc.KVMetaServiceStub]:
    async with serve_sessions(shell) as (_, stub):
        yield stub


async def turn(
    stub: kvmeta_pb2_grpc.KVMetaServiceStub, clock: ManualClock
) -> kvmeta_pb2.AgentSession:
    """One turn of session s1 that lasts 1 s and ends in a bash call."""
    d, t, sid = "default", "acme", "s1"
    await stub.StartSessionTurn(
        kvmeta_pb2.StartSessionTurnRequest(
            deployment=d, tenant=t, session_id=sid, agent="claude-code"
        )
    )
    clock.advance(1.0)
    req = kvmeta_pb2.EndSessionTurnRequest(
        deployment=d, tenant=t, session_id=sid, tool_names=["bash"]
    )
    session: kvmeta_pb2.AgentSession = (await stub.EndSessionTurn(req)).session
    return session


def predicted_gap_s(s: kvmeta_pb2.AgentSession) -> float:
    return (s.predicted_return_ms - s.last_turn_end_ms) / 1000.0


async def test_fresh_kvmeta_predicts_from_telemetry_until_its_own_data_is_confident(
    tmp_path: Path,
) -> None:
    token = new_token()
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(format_entry("kvmeta", Role.READ, token) + "\n")
    (tmp_path / "service.token").write_text(token + "\n")
    learner = learned()
    (bash,) = [r for r in learner.table("default", [0.9]) if r.tool == "bash"]
    assert bash.samples == SESSIONS
    clock = ManualClock(1_800_000_000.0)
    async with telemetry(learner, tokens_file) as port:
        base = {"telemetry_address": f"127.0.0.1:{port}", "session_percentile": 0.9}
        # without kvmeta's token telemetry refuses: no priors, kvmeta carries on
        anonymous = KVMetaSettings.model_validate(base)
        shell = _sessions(anonymous, None, clock.now)
        wired = _tool_priors(anonymous, shell.table.predictor)
        assert wired is not None
        priors, source = wired
        assert not await priors.refresh()
        assert (priors.failures, shell.table.predictor.priors) == (1, 0)
        await source.close()
        # with its client credentials (auth.token_file) kvmeta installs telemetry's table
        settings = KVMetaSettings.model_validate(
            {**base, "auth": {"token_file": tmp_path / "service.token"}}
        )
        shell = _sessions(settings, None, clock.now)
        wired = _tool_priors(settings, shell.table.predictor)
        assert wired is not None
        priors, source = wired
        try:
            assert await priors.refresh()
        finally:
            await source.close()
    assert shell.table.predictor.min_samples == MIN_SAMPLES
    async with kvmeta(shell) as stub:
        s = await turn(stub, clock)
        assert (s.prediction_source, s.prediction_samples) == ("prior_tool", SESSIONS)
        assert predicted_gap_s(s) == pytest.approx(bash.seconds[0], abs=0.002)
        assert bash.seconds[0] == pytest.approx(36.0, rel=0.05)  # p90 of 10..39 s
        for observed in range(1, MIN_SAMPLES + 1):
            clock.advance(OWN_GAP_S)  # the bash call took 5 s: an observation of kvmeta's
            s = await turn(stub, clock)
            if observed < MIN_SAMPLES:
                assert s.prediction_source == "prior_tool", observed
        assert (s.prediction_source, s.prediction_samples) == ("agent_tool", MIN_SAMPLES)
        assert predicted_gap_s(s) == pytest.approx(OWN_GAP_S, rel=0.03)
